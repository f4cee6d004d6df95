"""The PFC reaction benchmark's reading of results documents: a row per run that paused, the worst
p99 and max per experiment, and derated attempts left out."""

import json

import pytest

from fabriclab.errors import LabError
from fabriclab.workflows import pfcbench


def doc(name, *runs):
    return {"experiment": {"name": name}, "runs": [
        {"label": label, "queues": {"report": {"totals": {"lossless_drops": drops},
                                               "pfc_reaction": reaction}}} for label, reaction, drops in runs]}


PAUSED = {"pauses": 10, "p50_ms": 0.1, "p99_ms": 0.7, "max_ms": 0.9, "max_wait_ms": 0.8, "max_gate_change_ms": 0.05,
          "scheduling": "SCHED_FIFO 10"}
WORSE = {"pauses": 4, "p50_ms": 0.2, "p99_ms": 1.5, "max_ms": 2.5}


def test_rows_and_the_summary_take_the_worst_of_every_run():
    rows = pfcbench.rows_of(doc("pfc-incast", ("streaming", PAUSED, 0), ("receiver-driven", {"pauses": 0}, 0)), 1)
    rows += pfcbench.rows_of(doc("pfc-incast", ("streaming", WORSE, 3)), 2)
    assert [r["pauses"] for r in rows] == [10, 0, 4] and rows[0]["scheduling"] == "SCHED_FIFO 10"
    assert rows[2]["scheduling"] == "-"
    got = pfcbench.summary(rows)["pfc-incast"]
    assert got == {"runs": 3, "draws": 2, "pauses": 14, "worst_p99_ms": 1.5, "worst_max_ms": 2.5, "lossless_drops": 3}
    cells = pfcbench.table_rows(rows)
    assert cells[1][4:9] == ("-",) * 5 and cells[0][4:9] == ("0.100", "0.700", "0.900", "0.800", "0.050")
    assert cells[2][7:9] == ("-", "-")            # a document from before the split


def test_folders_are_read_without_their_derated_attempts(tmp_path):
    for where, d in (("cat/experiments/pfc-incast/draw-1", doc("pfc-incast", ("streaming", PAUSED, 0))),
                     ("cat/experiments/pfc-incast/draw-1.attempt-1", doc("pfc-incast", ("streaming", WORSE, 9))),
                     ("cat/experiments/ecmp-balance/draw-1", doc("ecmp-balance", ("ecmp", {"pauses": 0}, 0)))):
        (tmp_path / where).mkdir(parents=True)
        (tmp_path / where / "results.json").write_text(json.dumps(d))
    rows = pfcbench.read_folders([tmp_path / "cat"])
    assert [(r["experiment"], r["draw"], r["max_ms"]) for r in rows] == [("pfc-incast", "cat/draw-1", 0.9)]
    with pytest.raises(LabError, match="no results.json"):
        pfcbench.read_folders([tmp_path / "nothing"])
