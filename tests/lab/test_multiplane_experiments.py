"""The multiplane and adaptive-routing experiments (seed 002), quick versions, on real fabrics.
ar-fabric, multiplane-asymmetry and plane-failover are checked on every draw `reproduce --quick`
ran, for their mechanisms; the others run here. Each margin states the spread it was set from
(docs/testing.md); docs/multiplane.md quotes the full runs.

ar-fabric: AR balances the ring's uplinks; it reorders without retransmitting; a local failure
  costs no ACK timeout.
multiplane-asymmetry: asymmetric, per-plane keeps most of its bandwidth, the degraded planes are
  marked, and every burst starts with fresh CC contexts.
plane-convergence: every burst of every size starts with fresh contexts; the largest is marked and
  keeps most of its bandwidth (that the ratio grows with the size is the full experiment's finding).
plane-failover: per-plane is back at 75% at least 20x sooner than software; static never is.
plane-flaps: the slower the reaction, the longer the tail.
esr: ESR's throughput is lower than the PLB's, and its slowest job slower.
"""

import statistics

import pytest

from fabriclab.results import document
from fabriclab.workflows.experiments import (Options, ar_fabric, esr, multiplane_asymmetry, plane_convergence,
                                             plane_failover, plane_flaps, run_experiment)

pytestmark = pytest.mark.lab


# ar-fabric, multiplane-asymmetry and plane-failover run in `reproduce --quick`, over its draws:
# their tests check every draw's mechanisms; the comparisons are the claims 002-ar-balance,
# 002-plb-asymmetry and 002-plb-failover's
FROM_CATALOGUE = ("ar-fabric", "multiplane-asymmetry", "plane-failover")


def drawn(quick_catalogue, name):
    """[(k, draw k's document, its folder)] of an experiment reproduce --quick ran."""
    out = []
    for k, doc in quick_catalogue.docs(name):
        folder = quick_catalogue.folder_of(name, k)
        check(doc, folder)
        out.append((k, doc, folder))
    return out


def run(name, folder):
    doc = run_experiment(name, out=folder, options=Options(quick=True))
    check(doc, folder)
    assert all(run["valid"] for run in doc["runs"]), [(r["label"], r["invalid"]) for r in doc["runs"]]
    return doc


def check(doc, folder):
    on_disk = document.load(folder)                   # of the one schema
    assert on_disk["experiment"] == doc["experiment"] and on_disk["scale"]["time_scale"]
    assert "## Experiment" in (folder / "report.md").read_text()


def cnps_sent(job):
    """CNPs a collective job's ranks sent over the whole job, warm-ups included."""
    return sum(counters.get("cnp_sent", 0) for counters in job["rank_counters"].values())


def by_label(doc):
    return {r["label"]: r for r in doc["runs"]}


def ring(run):
    return run["jobs"]["ring"]["sizes"][0]


def test_ar_fabric(quick_catalogue, figure):
    for k, doc, folder in drawn(quick_catalogue, "ar-fabric"):
        cases = by_label(doc)
        ar = cases["AR"]
        # per-packet JSQ fills every uplink evenly, whatever the hash would have done: 1.005-1.019
        # (sd 0.006) over 5 quick draws of 3 catalogues, 2026-11-27; the bound, 1.1, is 13 sd above
        # the most. How ECMP's collisions compare is claim 002-ar-balance's
        assert figure(f"AR uplink max/mean, draw {k}", ar_fabric.live_uplinks(ar)) <= 1.1, k
        # AR reorders within a flow; the NICs place by PSN, so reordering costs no retransmission
        assert ring(ar)["counters"]["out_of_sequence"] > 0 and ring(ar)["counters"]["local_ack_timeout_err"] == 0, k
        failing = cases[f"AR, {ar_fabric.LOCAL} fails"]
        assert ring(failing)["counters"]["local_ack_timeout_err"] == 0, k
        assert (folder / "ar_fabric.png").stat().st_size > 10_000


def test_multiplane_asymmetry(quick_catalogue, figure):
    for k, doc, _folder in drawn(quick_catalogue, "multiplane-asymmetry"):
        cases = multiplane_asymmetry.cases(doc)
        per_plane = multiplane_asymmetry.kept(doc, "one-to-many", "per-plane")
        # per-plane keeps most of the symmetric busbw: 0.941-0.987 (sd 0.022) over 6 quick draws of
        # one burst, 2026-11-29 (0.958-0.966 over 5 draws of two, 2026-11-27); the bound, 0.75, is
        # 8.6 sd below. Global loses about as little at the lab's burst length (docs/multiplane.md
        # says why): claim 002-plb-asymmetry
        assert figure(f"per-plane asymmetric / symmetric busbw, draw {k}", per_plane) >= 0.75, k
        asym = cases[("one-to-many", "asymmetric", "per-plane")]["jobs"]["main"]
        # the degraded planes were marked: 8-11 CNPs over the job in each of those 6 draws (2-5 in
        # its measured burst alone, which one plane-convergence run of the same job saw none in)
        assert cnps_sent(asym) > 0, k
        # every burst starts with fresh contexts towards each destination: one release per burst
        # after the first, as the launcher leaves cc_idle_s of silence between iterations
        bursts = len(asym["sizes"][0]["cct_ms"]["all"]) + 1          # the warm-up is a burst too
        for case in cases.values():
            root = case["jobs"]["main"]["plb"]["ranks"]["0"]
            for dest in root["destinations"]:
                cc = dest.get("cc") or dest["planes"][0]["cc"]
                assert cc["resets"] == bursts - 1, (k, case["label"], dest["peer"], cc)
        assert "one-to-many: asymmetric keeps" in multiplane_asymmetry.table(doc)


def test_multiplane_asymmetry_under_spx_cc(tmp_path, figure):
    """--cc spx: SPX CC in every NIC, ar ECN marking in the switches (docs/multiplane.md, "SPX
    congestion control"). Asymmetric, per-plane keeps most of its busbw and global loses: per-plane
    0.99-1.00 and global 0.78 in both quick draws of 2026-12-02 (seeds 1 and 2)."""
    doc = run_experiment("multiplane-asymmetry", out=tmp_path, options=Options(quick=True, cc="spx"))
    check(doc, tmp_path)
    assert all(run["valid"] for run in doc["runs"]), [(r["label"], r["invalid"]) for r in doc["runs"]]
    per_plane = figure("SPX: per-plane asymmetric / symmetric busbw",
                       multiplane_asymmetry.kept(doc, "one-to-many", "per-plane"))
    glob = figure("SPX: global asymmetric / symmetric busbw", multiplane_asymmetry.kept(doc, "one-to-many", "global"))
    # two draws only: the bounds sit well outside them (0.2 below per-plane's, and global at
    # least 0.08 below per-plane where both draws had 0.21-0.22 between them)
    assert per_plane >= 0.8 and glob <= per_plane - 0.08, (per_plane, glob)
    cases = multiplane_asymmetry.cases(doc)
    assert doc["spec"]["queues"]["ecn"]["mode"] == "ar"
    for case in cases.values():
        main = case["jobs"]["main"]
        assert main["cc"]["kind"] == "spx" and main["cc"]["where"] == "plb contexts"
    # the global context was cut by the degraded planes' marks and took RTT samples meanwhile
    asym = cases[("one-to-many", "asymmetric", "global")]["jobs"]["main"]
    for dest in asym["plb"]["ranks"]["0"]["destinations"]:
        cc = dest["cc"]
        assert cc["cnps"] > 0 and cc["rate_decreases"] > 0 and cc["rtt_samples"] > 0, cc
        assert cc["rtt_probes"]["echoes"] > 0


def test_plane_convergence(tmp_path, figure):
    doc = run("plane-convergence", tmp_path)
    (series,) = plane_convergence.ratios(doc).values()
    figure("asymmetric / symmetric busbw, smallest message", series[0][-1])
    large = figure("asymmetric / symmetric busbw, largest message", series[-1][-1])
    # Whether the ratio grows with the size is the full experiment's finding (docs/multiplane.md),
    # not this test's: on this machine the quick sizes overlap. Over 10 runs of 2026-11-29 (one
    # burst a size, `python -m tests.repeat 10`), 1 MiB read 0.681-0.998 (sd 0.103) and 4 MiB
    # 0.943-0.998 (sd 0.016); with two bursts, 0.716-1.002 and 0.933-0.973 over 13 runs. The
    # 2026-11-27 machine kept them apart (1 MiB 0.690-0.855). The 0.75 floor for the largest is
    # 12 sd below its least. Asserted instead, the mechanism that makes a small message pay:
    assert len(series) == 2 and series[0][0] < series[1][0] and large >= 0.75, series
    # every burst of every size starts with fresh contexts towards each destination: one release
    # per burst after the first (each size's warm-up is a burst too) ...
    asym = next(r for r in doc["runs"] if r["tags"]["condition"] == "asymmetric")["jobs"]["main"]
    bursts = sum(len(row["cct_ms"]["all"]) + 1 for row in asym["sizes"])
    for dest in asym["plb"]["ranks"]["0"]["destinations"]:
        cc = dest.get("cc") or dest["planes"][0]["cc"]
        assert cc["resets"] == bursts - 1, (dest["peer"], cc)
    # ... and the degraded planes are marked over the job (its warm-ups included: the measured
    # 4 MiB burst alone went unmarked in one CI run of 2026-11-29)
    assert cnps_sent(asym) > 0, series
    assert (tmp_path / "plane_convergence.png").stat().st_size > 10_000


def test_plane_failover(quick_catalogue, figure):
    for k, doc, folder in drawn(quick_catalogue, "plane-failover"):
        took = {r["tags"]["plb"]: plane_failover.recovery(r) for r in doc["runs"]}
        per_plane, software = took["per-plane"]["recovery_s"], took["software"]["recovery_s"]
        # Back at 75%: software in 0.94-1.05 s (9 quick draws, 2026-11-27/28). Per-plane, whose
        # three healthy planes carry exactly 75%, read 0 or one 20 ms bin in those draws, and 3 bins
        # (60 ms) in one CI run of 2026-11-28: a few ms of stall anywhere in the first 0.2 s window
        # puts its mean under the target (3 planes' worth less 5%). Goodput is the loose check: back,
        # and in under a quarter of software's time (4x per-plane's worst). The 20x (paper 360x) is
        # claim 002-plb-failover's, judged over draws; here 20x is asserted on the plane's removal,
        # the mechanism. Half of the runs once took 0.35-0.38 s (once 1.76 s) when the queue model
        # charged a packet's departure to the port its flow had entered by last: a 0.2-0.3 s PFC
        # pause on an account that leaked (tests/lab/test_queue_leaks.py).
        assert per_plane is not None and software is not None, (k, took)
        figure(f"recovery software / per-plane, draw {k}", plane_failover.speedup(took)[0])
        assert per_plane < software / 4, (k, took)
        assert took["static"]["recovery_s"] is None, k
        # The plane is out locally within milliseconds against the software balancer's timeout
        # (0.76 s): the target is 20x sooner. Measured 123-296x over 5 draws (per-plane
        # 2.6-6.3 ms; 20x would allow 39 ms). Either local sign can come
        # first: the carrier's netlink event, or a send the stack refuses as unreachable (agent.py).
        events = {mode: took[mode]["events"] for mode in ("per-plane", "software")}
        assert events["per-plane"][0][:2] in (("removed", "carrier"), ("removed", "send")), (k, events)
        assert events["per-plane"][-1][0] == "returned", (k, events)
        assert events["software"][0][:2] == ("removed", "timeout"), (k, events)
        assert figure(f"plane removal software / per-plane, draw {k}",
                      events["software"][0][2] / events["per-plane"][0][2]) >= 20, (k, events)
        assert (folder / "plane_failover.png").stat().st_size > 10_000


def test_plane_flaps(quick_catalogue, figure):
    """Flaps happen, the NICs take the planes out, per-plane sooner than software's timeout, on
    every draw. Whether that shortens the tail (CCT p99) is claim 002-flap-tail's to judge: one
    flap on the wrong ring step decides a quick draw's p99 (a CI run measured software / per-plane
    0.93, one before 1.7)."""
    for k, doc, folder in drawn(quick_catalogue, "plane-flaps"):
        cases = by_label(doc)
        base, per_plane, software = cases["no flaps"], cases["per-plane"], cases["software, 0.4 s"]
        assert plane_flaps.downs(per_plane) and plane_flaps.downs(software), k
        assert not plane_flaps.downs(base), k
        assert plane_flaps.reactions(per_plane) and plane_flaps.reactions(software), k
        # Per-plane takes its own plane out on carrier loss (milliseconds) and a peer's after a
        # few probe timeouts (about 0.15 s); software waits out its 0.4 s timeout each time. Two
        # runs measured the medians 0.08 against 0.38-0.39 s (ratio 4.7-4.9).
        reaction = figure(f"median reaction software / per-plane, draw {k}",
                          statistics.median(plane_flaps.reactions(software))
                          / statistics.median(plane_flaps.reactions(per_plane)))
        assert reaction > 1, k
        assert (folder / "plane_flaps.png").stat().st_size > 10_000


def test_esr(tmp_path, figure):
    doc = run("esr", tmp_path)
    cases = by_label(doc)
    busbw = {name: [j["sizes"][0]["busbw_mbps"] for j in r["jobs"].values()] for name, r in cases.items()}
    competing = {name: statistics.mean(esr.together(esr.throughput(r)[1])) for name, r in cases.items()}
    # Over 10 runs (2026-11-27, `./lab.sh test --repeat 10`), PLB+AR against ESR+ECMP: summed
    # busbw 1.144-1.274 (sd 0.038), the slowest job 1.274-1.320 (sd 0.015), while both send
    # 1.147-1.232 (sd 0.032). The direction is the bound: 3.8, 19 and 4.6 sd below the least
    # seen. (The sum's bound was 1.1, 1.2 sd below its least: it would have failed in time.)
    assert figure("summed busbw PLB+AR / ESR+ECMP", sum(busbw["PLB + AR"]) / sum(busbw["ESR + ECMP"])) > 1, busbw
    assert figure("slowest job's busbw PLB+AR / ESR+ECMP", min(busbw["PLB + AR"]) / min(busbw["ESR + ECMP"])) > 1, busbw
    assert figure("Mbit/s while both send, PLB+AR / ESR+ECMP",
                  competing["PLB + AR"] / competing["ESR + ECMP"]) > 1, competing
