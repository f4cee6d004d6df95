"""The flow model against the emulation on a real small fabric (issue 7's calibration)."""

import pytest

from fabriclab.model.calibrate import run_calibration
from fabriclab.results import document
from fabriclab.topologies.spec import FabricSpec

pytestmark = pytest.mark.lab

SPEC = FabricSpec(name="t-calib", leaves=2, spines=2, hosts_per_leaf=2,
                  host_rate_mbps=20, fabric_rate_mbps=20)


@pytest.mark.parametrize("collective", ["allreduce", "alltoall"])
def test_model_predicts_the_emulated_completion_time(collective, tmp_path, figure):
    """Host links bound both collectives here; the model (payload bytes at line rate, no
    headers, ACKs or queues) should land within 15% below what the emulation measures."""
    doc, rows = run_calibration(SPEC, collective, sizes=(512 * 1024,), iterations=2, out=tmp_path)
    (row,) = rows
    assert row["valid"], doc["runs"][0]["invalid"]
    assert document.load(tmp_path)["kind"] == "calibration"
    assert -0.15 < figure(f"(model - emulated) / emulated CCT, {collective}", row["ecmp_error"]) < 0.02, row
    assert row["ideal_cct_s"] <= row["ecmp_cct_s"] + 1e-9
    assert doc["calibration"]["model_schemes"] == ["ecmp", "ideal"]
