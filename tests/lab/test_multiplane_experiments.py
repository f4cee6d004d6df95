"""The multiplane and adaptive-routing experiments (seed 002), quick versions, on real fabrics:
each must show the paper's effect in the direction and, where the lab reproduces it, the size
the issue asks for. The margins below the measured values are for a loaded 2-core machine;
docs/multiplane.md quotes the full runs.

ar-fabric: AR balances the ring's uplinks where ECMP collides them; a local failure costs no
  ACK timeout.
multiplane-asymmetry: symmetric, per-plane and global CC are alike; asymmetric, per-plane keeps
  most of its bandwidth, and every burst starts with fresh CC contexts.
plane-convergence: the asymmetric/symmetric ratio grows with the message size.
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


# ar-fabric, multiplane-asymmetry and plane-failover run once, in `reproduce --quick`
FROM_CATALOGUE = ("ar-fabric", "multiplane-asymmetry", "plane-failover")


@pytest.fixture
def folder(request, tmp_path):
    """Where the test's experiment wrote: reproduce's folder for those it runs, else tmp_path."""
    name = request.node.name.removeprefix("test_").replace("_", "-")
    if name in FROM_CATALOGUE:
        return request.getfixturevalue("quick_catalogue").folder_of(name)
    return tmp_path


def run(name, folder):
    if name in FROM_CATALOGUE:
        doc = document.load(folder)
    else:
        doc = run_experiment(name, out=folder, options=Options(quick=True))
    on_disk = document.load(folder)                   # of the one schema
    assert on_disk["experiment"] == doc["experiment"] and on_disk["scale"]["time_scale"]
    assert "## Experiment" in (folder / "report.md").read_text()
    assert all(run["valid"] for run in doc["runs"]), [(r["label"], r["invalid"]) for r in doc["runs"]]
    return doc


def by_label(doc):
    return {r["label"]: r for r in doc["runs"]}


def ring(run):
    return run["jobs"]["ring"]["sizes"][0]


def test_ar_fabric(folder):
    doc = run("ar-fabric", folder)
    cases = by_label(doc)
    ecmp, ar = cases["ECMP"], cases["AR"]
    # the target: AR at most 1.1 where ECMP shows 1.5 or more (measured 2.0 and 1.00)
    assert ar_fabric.live_uplinks(ecmp) >= 1.5 and ar_fabric.live_uplinks(ar) <= 1.1
    # ECMP is held to half rate by its collisions; AR's spraying costs host CPU, which on a slower
    # 2-core machine caps it short of line rate (quick form: 7.77 against 3.97 here, 5.63 and 5.71
    # against 3.97 on CI's machines), so the margin asked for is what both showed
    assert ring(ar)["busbw_mbps"] > 1.3 * ring(ecmp)["busbw_mbps"]
    # AR reorders within a flow; the NICs place by PSN, so reordering costs no retransmission
    assert ring(ar)["counters"]["out_of_sequence"] > 0 and ring(ar)["counters"]["local_ack_timeout_err"] == 0
    failing = cases[f"AR, {ar_fabric.LOCAL} fails"]
    assert ring(failing)["counters"]["local_ack_timeout_err"] == 0
    assert (folder / "ar_fabric.png").stat().st_size > 10_000


def test_multiplane_asymmetry(folder):
    doc = run("multiplane-asymmetry", folder)
    cases = multiplane_asymmetry.cases(doc)
    sym = {mode: cases[("one-to-many", "symmetric", mode)]["jobs"]["main"]["sizes"][0]["busbw_mbps"]
           for mode in multiplane_asymmetry.MODES}
    assert abs(sym["per-plane"] - sym["global"]) <= 0.05 * sym["per-plane"], sym
    per_plane = multiplane_asymmetry.kept(doc, "one-to-many", "per-plane")
    # measured over four quick runs: per-plane 0.95-0.96; global 0.96-1.01, no loss at the lab's
    # burst length (docs/multiplane.md says why), so the test does not order them
    assert per_plane >= 0.75, per_plane
    asym = cases[("one-to-many", "asymmetric", "per-plane")]["jobs"]["main"]
    assert asym["sizes"][0]["counters"]["cnp_sent"] > 0         # the degraded planes were marked
    # every burst starts with fresh contexts towards each destination: one release per burst
    # after the first, as the launcher leaves cc_idle_s of silence between iterations
    bursts = len(asym["sizes"][0]["cct_ms"]["all"]) + 1          # the warm-up is a burst too
    for case in cases.values():
        root = case["jobs"]["main"]["plb"]["ranks"]["0"]
        for dest in root["destinations"]:
            cc = dest.get("cc") or dest["planes"][0]["cc"]
            assert cc["resets"] == bursts - 1, (case["label"], dest["peer"], cc)
    assert "one-to-many: asymmetric keeps" in multiplane_asymmetry.table(doc)


def test_plane_convergence(tmp_path):
    doc = run("plane-convergence", tmp_path)
    (series,) = plane_convergence.ratios(doc).values()
    small, large = series[0][-1], series[-1][-1]
    # measured: 1 MiB 0.46-0.47, 4 MiB 0.83-0.88
    assert small < large and large >= 0.75, series
    assert (tmp_path / "plane_convergence.png").stat().st_size > 10_000


def test_plane_failover(folder):
    doc = run("plane-failover", folder)
    took = {r["tags"]["plb"]: plane_failover.recovery(r) for r in doc["runs"]}
    per_plane, software = took["per-plane"]["recovery_s"], took["software"]["recovery_s"]
    # Back at 75%: measured 0.004-0.020 s against 1.02-1.10 s (52-290x) in 8 runs. Half took
    # 0.35-0.38 s (once 1.76 s) when the queue model charged a packet's departure to the port its
    # flow had entered by last: a 0.2-0.3 s PFC pause on an account that leaked (tests/lab/test_queue_leaks.py).
    assert per_plane is not None and software is not None and per_plane * 20 <= software, took
    assert took["static"]["recovery_s"] is None
    # The plane is out locally within milliseconds (measured 3.1-3.7 ms) against the software
    # balancer's timeout (0.76 s); the target is 20x sooner. Either local sign can come
    # first: the carrier's netlink event, or a send the stack refuses as unreachable (agent.py).
    events = {mode: took[mode]["events"] for mode in ("per-plane", "software")}
    assert events["per-plane"][0][:2] in (("removed", "carrier"), ("removed", "send")), events
    assert events["per-plane"][-1][0] == "returned", events
    assert events["software"][0][:2] == ("removed", "timeout"), events
    assert events["per-plane"][0][2] * 20 <= events["software"][0][2], events
    assert (folder / "plane_failover.png").stat().st_size > 10_000


def test_plane_flaps(tmp_path):
    doc = run("plane-flaps", tmp_path)
    cases = by_label(doc)
    base, per_plane, software = cases["no flaps"], cases["per-plane"], cases["software, 0.4 s"]
    assert plane_flaps.downs(per_plane) and plane_flaps.downs(software)
    assert not plane_flaps.downs(base)
    # measured: p99 323/411/690 ms p50; reaction 0.08 s against 0.39 s
    assert statistics.median(plane_flaps.reactions(per_plane)) < statistics.median(plane_flaps.reactions(software))
    assert ring(software)["cct_ms"]["p99"] > ring(per_plane)["cct_ms"]["p99"]


def test_esr(tmp_path):
    doc = run("esr", tmp_path)
    cases = by_label(doc)
    busbw = {name: [j["sizes"][0]["busbw_mbps"] for j in r["jobs"].values()] for name, r in cases.items()}
    competing = {name: statistics.mean(esr.together(esr.throughput(r)[1])) for name, r in cases.items()}
    # measured (quick): busbw 23.7 against 19.0 Mbit/s in all, 11.8 against 9.3 for the slowest job,
    # 46.3 against 38.5 Mbit/s while both jobs send
    assert sum(busbw["PLB + AR"]) > 1.1 * sum(busbw["ESR + ECMP"]), busbw
    assert min(busbw["PLB + AR"]) > min(busbw["ESR + ECMP"]), busbw
    assert competing["PLB + AR"] > competing["ESR + ECMP"], competing
