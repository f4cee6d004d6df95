"""`benchmark --run-phases`: a run's phases and the fabric's bring-up, summed per experiment over
every results.json under the folders given."""

import json

import pytest

from fabriclab.errors import LabError
from fabriclab.workflows import runphases


def write(folder, name, up, runs):
    folder.mkdir(parents=True)
    doc = {"experiment": {"name": name}, "timings_s": {"up_s": up, "down_s": 1.0},
           "runs": [{"label": f"r{i}", "timings_s": phases} for i, phases in enumerate(runs)]}
    (folder / "results.json").write_text(json.dumps(doc))


def test_phases_are_summed_per_experiment_over_draws(tmp_path):
    one = {"routing_s": 1.0, "start_s": 0.5, "traffic_s": 2.0, "record_s": 0.5, "run_s": 4.0}
    write(tmp_path / "cat" / "draw-1", "pfc-incast", 2.0, [one, one])
    write(tmp_path / "cat" / "draw-2", "pfc-incast", 3.0, [one])
    write(tmp_path / "cat" / "old", "ecn-dcqcn", 1.0, [{}])          # written before runs had phases
    totals = runphases.read_folders([tmp_path / "cat"])
    incast = totals["pfc-incast"]
    assert (incast["documents"], incast["runs"], incast["up_s"], incast["down_s"]) == (2, 3, 5.0, 2.0)
    assert (incast["routing_s"], incast["traffic_s"], incast["run_s"], incast["drain_s"]) == (3.0, 6.0, 12.0, 0.0)
    rows = runphases.table_rows(totals)
    assert rows[0][0] == "pfc-incast" and rows[0][-1] == "32%"          # 6 s of traffic in 19 s
    assert rows[1][0] == "ecn-dcqcn" and rows[1][-1] == "-"
    with pytest.raises(LabError, match="no results.json"):
        runphases.read_folders([tmp_path / "none"])
