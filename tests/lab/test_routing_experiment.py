"""routing-schemes, quick version, on the 4x4 1:1 fabric (the draws `reproduce --quick` ran): each
scheme's mechanism on every draw. Which scheme is faster is a statement about draws of the hash,
judged over them by the claims 000-qp-scaling, 000-eecmp-gain and 000-te-balance
(tests/lab/test_reproduce.py), not by one run here."""

import pytest

from fabriclab.results import document
from fabriclab.workflows.experiments import routing

pytestmark = pytest.mark.lab


def test_routing_schemes_show_each_schemes_mechanism_on_every_draw(quick_catalogue, figure):
    for k, doc in quick_catalogue.docs("routing-schemes"):
        assert "lossless (PFC, ECN off)" in routing.table(doc)
        cases = {r["label"]: r for r in doc["runs"]}
        ring = {name: r["jobs"]["ring"]["sizes"][0] for name, r in cases.items()}
        # E-ECMP keeps each QP on one path and PFC drops nothing, so it never sees a packet out of
        # order: on every draw, whatever the hash
        eecmp = ring["E-ECMP + 4 QPs shared sport"]
        assert eecmp["counters"]["out_of_sequence"] == 0 and eecmp["buffer_drops"]["total"] == 0, (k, eecmp)
        # TE places every flow of the ring on an uplink of its own: all of them placed, and the
        # uplinks even (a placement, not a draw: 1.004-1.024, sd 0.008, over 5 quick draws of 3
        # catalogues, 2026-11-27; the bound, 1.25, is 28 sd above the most)
        te = cases["TE"]["routing_state"]["te"]
        assert te["placed"] >= 16 and te["unplaced"] == 0, (k, te)
        assert figure(f"TE uplink max/mean, draw {k}", ring["TE"]["balance"]["up"]["max_mean_ratio"]) < 1.25
        # E-ECMP: its stage decided every RoCE packet at the leaf uplinks, with the QP in the hash,
        # and sent some of them to another member than OVS's group chose
        stage = cases["E-ECMP + 4 QPs shared sport"]["routing_state"]["stage"]
        assert stage["packets"] == stage["roce"] > 0 and stage["redirected"] > 0, (k, stage)
        for name, run in cases.items():
            if "fails" in name:
                (fault,) = run["faults"]
                assert fault["at_s"] == pytest.approx(routing.FAULT_AFTER_S, abs=0.1)
                assert fault["impact"]["recovery_s"] is not None and fault["impact"]["baseline_mbps"] > 0, (k, name)
                assert fault["uplinks_after"]["max_mean_ratio"] >= 1.0
                # the failed link came back after the run: the next run starts on a whole fabric
                assert [e["event"] for e in run["events"]] == ["link_down", "link_up"]
        folder = quick_catalogue.folder_of("routing-schemes", k)
        on_disk = document.load(folder)
        assert on_disk["scale"]["time_scale"] and on_disk["scale"]["host_rate_mbps"] == 10
        assert on_disk["plan"]["source"]["seed"] == k and on_disk["plan"]["source"]["shuffle"] is True
        assert (folder / "routing_schemes.png").stat().st_size > 10_000
        assert (folder / "routing_failures.png").stat().st_size > 10_000
        assert "TE" in routing.table(doc)
