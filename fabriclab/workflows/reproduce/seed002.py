"""Claims of seed 002 (NVIDIA Spectrum-X): multiplane load balancing and adaptive routing."""

from __future__ import annotations

from fabriclab.workflows.reproduce.claim import Claim, Effect, Finding, invalid_reasons, ratio, runs_by_label


def plb_asymmetry(docs):
    from fabriclab.workflows.experiments.multiplane_asymmetry import kept

    doc = docs["multiplane-asymmetry"]
    per_plane, glob = kept(doc, "one-to-many", "per-plane"), kept(doc, "one-to-many", "global")
    return Finding(
        lab=f"one-to-many keeps {per_plane:.0%} (per-plane) and {glob:.0%} (global) of its symmetric busbw",
        lab_value=per_plane, effects=(Effect("busbw kept, per-plane - global", per_plane - glob, ">", 0.0),),
        direction="per-plane congestion contexts keep more of the symmetric busbw than one global context",
        bars=[("paper: per-plane", 93.7 / 94.5), ("lab: per-plane", per_plane),
              ("paper: global", 47.3 / 94.5), ("lab: global", glob)],
        unit="asymmetric / symmetric busbw", invalid=invalid_reasons(doc))


def plb_failover(docs):
    from fabriclab.workflows.experiments.plane_failover import recovery, speedup

    doc = docs["plane-failover"]
    got = {r["tags"]["plb"]: recovery(r) for r in doc["runs"]}
    took = {mode: g["recovery_s"] for mode, g in got.items()}
    fast, slow = took.get("per-plane"), took.get("software")
    times, bound = speedup(got)
    return Finding(
        lab=f"back to 75% in {'under ' if bound else ''}{max(fast, got['per-plane']['resolution_s']):.3f} s "
            f"(per-plane) against {slow:.3f} s (software): {bound}{times:.0f}x sooner; static split: "
            f"{'never during the outage' if took.get('static') is None else took['static']}"
        if times is not None else f"recovery times {took}",
        lab_value=times,
        effects=(Effect("recovery software / per-plane", times if times is not None else float("nan"), ">", 1.0),
                 Effect("static split recovered during the outage (1 yes, 0 no)",
                        float(took.get("static") is not None), "<", 0.5)),
        direction="the NIC's per-plane balancer recovers far sooner than software; a static split never does",
        bars=[("paper: software / per-plane", 1.08 / 0.003), ("lab: software / per-plane", times)],
        unit="recovery time ratio", invalid=invalid_reasons(doc))


def flap_tail(docs):
    import statistics

    from fabriclab.workflows.experiments.plane_flaps import reactions

    doc = docs["plane-flaps"]
    runs = runs_by_label(doc)
    software = "software, 0.4 s"          # in the quick form and the full one (0.1, 0.4, 1.6 s)
    fast, slow = runs["per-plane"], runs[software]
    react = {name: statistics.median(reactions(r)) if reactions(r) else float("nan")
             for name, r in (("per-plane", fast), ("software", slow))}
    p99 = {name: r["jobs"]["ring"]["sizes"][0]["cct_ms"]["p99"] for name, r in (("per-plane", fast), ("software", slow))}
    return Finding(
        lab=f"median reaction {react['per-plane']:.3f} s (per-plane) against {react['software']:.3f} s ({software}); "
            f"CCT p99 {p99['per-plane']:.0f} against {p99['software']:.0f} ms",
        lab_value=ratio(p99["software"], p99["per-plane"]),
        effects=(Effect("median reaction software / per-plane", ratio(react["software"], react["per-plane"]), ">", 1.0),
                 Effect("CCT p99 software / per-plane", ratio(p99["software"], p99["per-plane"]), ">", 1.0)),
        direction="NICs that take a flapping plane out sooner keep the collective's tail shorter",
        bars=[("lab: p99 per-plane (ms)", p99["per-plane"]), ("lab: p99 software (ms)", p99["software"])],
        unit="CCT p99 (ms)", invalid=invalid_reasons(doc))


def ar_balance(docs):
    from fabriclab.workflows.experiments.ar_fabric import live_uplinks

    doc = docs["ar-fabric"]
    runs = runs_by_label(doc)
    ar, ecmp = runs["AR"], runs["ECMP"]
    busbw = lambda r: r["jobs"]["ring"]["sizes"][0]["busbw_mbps"]   # noqa: E731
    return Finding(
        lab=f"uplink max/mean {live_uplinks(ar):.2f} (AR) against {live_uplinks(ecmp):.2f} (ECMP); busbw "
            f"{busbw(ar):.2f} against {busbw(ecmp):.2f} Mbit/s",
        lab_value=live_uplinks(ar),
        effects=(Effect("uplink max/mean AR / ECMP", ratio(live_uplinks(ar), live_uplinks(ecmp)), "<", 1.0),
                 Effect("busbw AR / ECMP", ratio(busbw(ar), busbw(ecmp)), ">", 1.0)),
        direction="per-packet AR balances the uplinks better than ECMP and raises busbw",
        bars=[("lab: AR uplink max/mean", live_uplinks(ar)), ("lab: ECMP uplink max/mean", live_uplinks(ecmp))],
        unit="uplink max/mean", invalid=invalid_reasons(doc, "AR", "ECMP"))


CLAIMS = (
    Claim("002-plb-asymmetry", "002", "6.7, Figures 15a-b, 16", "with planes of unequal capacity, per-plane "
          "congestion contexts keep nearly all of the symmetric busbw, one global context loses half",
          "per-plane 99% (93.7 of 94.5 GB/s), global 50% (47.3)", 93.7 / 94.5,
          ("multiplane-asymmetry",), plb_asymmetry,
          "paper: 4 planes, two degraded, 8 NICs under leaf 1 sending 4 GB bursts to 16 beside noise; lab: "
          "the `spectrumx_fig16` spec, 4 planes of 3 Mbit/s ports for 200G (half that in the quick form), one NIC "
          "scattering 4 MiB bursts (1 and 4 MiB in the full run) to two beside a noise AlltoAll, AR in the switches",
          "each burst starts with fresh contexts (seed 002 6.7) and lasts about 40 us of real time at the "
          "lab's scale, where the paper's messages run 40 ms: the global context hears few marks from one "
          "sender and DCQCN recovers it within the burst, so it loses about as little as per-plane. A "
          "context carried from burst to burst (`--cc-idle 0`) is cut to a trickle instead",
          reproduced=False),
    Claim("002-plb-failover", "002", "6.5, Figure 12", "when a plane's link fails, the NIC's per-plane "
          "balancer is back to 75% of line rate in under 3 ms, software balancing takes 1.08 s (~400x)",
          "1.08 s / 3 ms = 360x", 1.08 / 0.003, ("plane-failover",), plb_failover,
          "paper: 4-plane NIC, one plane's host link down; lab: the `multiplane_pfc` spec, a 2-rank stream, "
          "plane 2's host link down for 2-3 s",
          "the lab's software timeout is its own (0.8 s quick), and the per-plane reaction is bounded by "
          "the lab's probe and carrier timers, not an ASIC's"),
    Claim("002-flap-tail", "002", "6.6, Figure 14b", "under host link flaps the collective's tail grows with "
          "the time the NICs take to take a failed plane out: P99 CCT +20% within 10 ms of convergence, "
          "+53% at 100 ms, +260% at 300 ms", "a direction", None, ("plane-flaps",), flap_tail,
          "paper: simulation, 10 s flaps; lab: the `multiplane_pfc` spec, a ring AllReduce over every host "
          "while host links flap (1/s in all, 0.4 s down), per-plane against software with a 0.4 s timeout",
          "the per-plane reaction is bounded by the lab's probe and carrier timers (a peer's plane goes "
          "after a few probe timeouts, about 0.15 s), not an ASIC's; a quick run's p99 is over 6 "
          "iterations, so one flap on the wrong ring step decides a draw"),
    Claim("002-ar-balance", "002", "3.2, 4.1", "per-packet adaptive routing (JSQ) spreads traffic evenly "
          "over the uplinks where ECMP's hash collides", "a direction", None,
          ("ar-fabric",), ar_balance,
          "paper: Spectrum-X switches, AR per packet; lab: the `ar_fabric` spec (parallel links, lossless), "
          "the routing-schemes ring on placing NICs"),
)
