"""Every example in examples/ runs, and does what its description says."""

import pathlib
import runpy
import subprocess
import sys

import pytest

pytestmark = pytest.mark.lab

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def test_ecmp_failover_example_moves_the_load_and_brings_it_back(capsys):
    run = runpy.run_path(str(EXAMPLES / "ecmp_failover.py"))["main"]("tiny")
    out = capsys.readouterr().out
    assert "reprogrammed in" in out and "totals:" in out
    # in `tiny` (one host per leaf) l1 port 1 faces h1 and port 2 is its uplink to s1
    via_s1 = [mbps for t, mbps in run.series("l1-eth2") if 2.6 <= t <= 4.0]
    assert via_s1 and max(via_s1) < 0.05          # nothing on l1-s1 while it is down
    assert run.totals()["loss"] < 0.05


def test_failover_session_example_runs_at_the_prompt():
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "up", "tiny", "--script",
                           str(EXAMPLES / "failover_session.txt")], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "1 equal-cost path(s)" in out and "delivered" in out and "1 received" in out
    assert "error" not in out.lower()
