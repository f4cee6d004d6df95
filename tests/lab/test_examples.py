"""Every example in examples/ runs, and does what its description says."""

import pathlib
import runpy
import subprocess
import sys

import pytest

pytestmark = pytest.mark.lab

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def test_ecmp_failover_example_moves_the_load_and_brings_it_back(capsys, tmp_path, figure):
    run = runpy.run_path(str(EXAMPLES / "ecmp_failover.py"))["main"]("tiny", tmp_path)
    out = capsys.readouterr().out
    assert "link down l1-s1 at" in out and "totals:" in out
    # nothing on l1-s1 while it is down
    assert figure("l1>s1 Mbit/s while down", run.mean_mbps("l1>s1", 2.6, 4.0)) < 0.05
    assert figure("l1>s1 Mbit/s before the failure", run.mean_mbps("l1>s1", 0.5, 1.9)) > 0.5
    assert figure("l1>s2 Mbit/s while l1-s1 is down", run.mean_mbps("l1>s2", 2.6, 4.0)) > 0.5
    assert figure("all-pairs loss", run.record["jobs"]["traffic"]["traffic"]["loss"]) < 0.05


def test_allreduce_qp_scaling_example_adds_source_ports_unless_shared(capsys, tmp_path):
    rows = runpy.run_path(str(EXAMPLES / "allreduce_qp_scaling.py"))["main"]("default", 256 * 1024, tmp_path)
    assert "uplink max/mean" in capsys.readouterr().out
    one, four, shared = rows
    assert all(row["verified"] for row in rows)
    assert four["sports_in_use"] > one["sports_in_use"]
    # shared: one source port per NIC pair, and the ring has 8 NIC pairs
    assert shared["sports_in_use"] <= 8 < four["sports_in_use"]


def test_failover_session_example_runs_at_the_prompt():
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli.main", "up", "tiny", "--script",
                           str(EXAMPLES / "failover_session.txt")], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "1 equal-cost path(s)" in out and "delivered" in out and "1 received" in out
    assert "error" not in out.lower()


def test_readme_pytest_snippet_passes(tmp_path):
    """The README's 'your own experiment in pytest' block is real code: run it with pytest."""
    readme = (EXAMPLES.parent / "README.md").read_text()
    section = readme.split("### Your own experiment in pytest", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    test_file = tmp_path / "test_readme_snippet.py"
    test_file.write_text(code)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
