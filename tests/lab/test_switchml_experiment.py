"""The packaged SwitchML experiment in its quick form: it must show what seed 003 reports."""

import pytest

from fabriclab.results import document
from fabriclab.workflows.experiments import module

pytestmark = pytest.mark.lab


def test_switchml_against_ring_and_under_loss(quick_catalogue):
    doc = quick_catalogue.doc("switchml")              # run once, by reproduce --quick
    tmp_path = quick_catalogue.folder_of("switchml")
    sml = module("switchml")
    cases = [(tags, s["jobs"]["switchml"]["aggregation"], r["jobs"]["ring"]["sizes"][0], s)
             for tags, s, r in sml.cases(doc)]
    sizes = [c for c in cases if c[0]["kind"] == "size"]
    for tags, agg, ring, _run in sizes:
        n = tags["workers"]
        assert agg["verify"]["ok"] and agg["verify"]["exact"]
        # Without loss, a resend is a timer that fired early (a busy machine); they stay rare.
        assert agg["retransmissions"] <= 0.05 * agg["packets_sent"], agg["retransmissions"]
        # Bytes a worker sends: one tensor (plus headers) against a ring's 2(n-1)/n tensors.
        ratio = ring["bytes_sent_per_rank"][0] / agg["bytes_sent_per_worker"]
        assert ratio == pytest.approx(2 * (n - 1) / n, rel=0.05)
    big3 = max((c for c in sizes if c[0]["workers"] == 3), key=lambda c: c[0]["elements"])
    assert big3[2]["cct_ms"]["p50"] > 1.05 * big3[1]["tat_s"]["p50"] * 1e3
    loss = {tags["loss"]: (agg, run) for tags, agg, _ring, run in cases if tags["kind"] == "loss"}
    assert loss[0.01][1]["link_loss"]["dropped_packets"] > 0 and loss[0.01][0]["retransmissions"] > 0
    assert [c["kind"] for c in loss[0.01][1]["conditions"]] == ["loss"]
    assert loss[0.01][0]["tat_s"]["p50"] > loss[0.0][0]["tat_s"]["p50"]
    assert all(agg["verify"]["result_sha256"] == loss[0.0][0]["verify"]["result_sha256"]
               for agg, _run in loss.values())
    assert doc["scale"]["time_scale"] == 5000
    assert document.load(tmp_path)["kind"] == "experiment"
    for name in ("results.json", "report.md", "tat-n2.png", "tat-n3.png", "loss-inflation.png", "timeline.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "SwitchML vs ring AllReduce" in sml.table(doc)
