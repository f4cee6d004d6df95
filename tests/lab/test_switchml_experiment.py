"""The packaged SwitchML experiment in its quick form: it must show what seed 003 reports."""

import pytest

from fabriclab.workflows.experiments import Options, module, run_experiment

pytestmark = pytest.mark.lab


def test_switchml_against_ring_and_under_loss(tmp_path):
    doc = run_experiment("switchml", out=tmp_path, options=Options(quick=True))
    sizes = [c for c in doc["cases"] if c["kind"] == "size"]
    for c in sizes:
        n, sml, ring = c["workers"], c["switchml"], c["ring"]
        assert sml["verify"]["ok"] and sml["verify"]["exact"]
        # Without loss, a resend is a timer that fired early (a busy machine); they stay rare.
        assert sml["retransmissions"] <= 0.05 * sml["packets_sent"], sml["retransmissions"]
        # Bytes a worker sends: one tensor (plus headers) against a ring's 2(n-1)/n tensors.
        ratio = ring["bytes_sent_per_rank"][0] / sml["bytes_sent_per_worker"]
        assert ratio == pytest.approx(2 * (n - 1) / n, rel=0.05)
    big3 = max((c for c in sizes if c["workers"] == 3), key=lambda c: c["elements"])
    assert big3["ring"]["cct_ms"]["p50"] > 1.05 * big3["switchml"]["tat_s"]["p50"] * 1e3
    loss = {c["loss"]: c for c in doc["cases"] if c["kind"] == "loss"}
    assert loss[0.01]["packets_dropped"] > 0 and loss[0.01]["switchml"]["retransmissions"] > 0
    assert loss[0.01]["switchml"]["tat_s"]["p50"] > loss[0.0]["switchml"]["tat_s"]["p50"]
    assert all(c["switchml"]["verify"]["result_sha256"] == loss[0.0]["switchml"]["verify"]["result_sha256"]
               for c in loss.values())
    assert doc["scale"]["time_scale"] == 5000
    for name in ("results.json", "tat-n2.png", "tat-n3.png", "loss-inflation.png", "timeline.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "SwitchML vs ring AllReduce" in module("switchml").table(doc)
