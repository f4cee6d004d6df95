"""The command line end to end: `run` with link events and `collective` write honest results of
the one schema that `report` and `compare` read; `up` drives a prompt."""

import json
import subprocess
import sys

import pytest

from fabriclab.results import compare, document, perftest
from tests.lab import labutil
from tests.unit.test_nccl_format import FIELD_ENDS, MODES, field_ends, parse
from tests.unit.test_perftest_format import parse as parse_perftest

pytestmark = pytest.mark.lab

FABRICLAB = [sys.executable, "-m", "fabriclab.cli.main"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The results folders this module's commands write, for the comparison at its end."""
    return {}


def test_run_with_a_link_failure_writes_results_with_scale(tmp_path, folders):
    before = labutil.resources()
    proc = subprocess.run(FABRICLAB + ["run", "tiny", "--duration", "4", "--flows-per-pair", "4",
                                       "--link-down", "l1-s1@1", "--link-up", "l1-s1@2.5",
                                       "--out", str(tmp_path), "--format", "json"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode in (0, 1), proc.stderr     # 1: valid but CPU-saturated run
    doc = json.loads(proc.stdout)
    assert document.load(tmp_path) == doc                # on disk, and of the one schema
    assert doc["kind"] == "run" and doc["schema_version"] == 1
    scale = doc["scale"]
    assert scale["host_rate_mbps"] == 10 and scale["fabric_rate_mbps"] == 10
    assert scale["buffers_bytes"] == {"host": 65536, "leaf": 65536, "spine": 262144}
    assert scale["time_scale"] == pytest.approx(40000)
    assert doc["mechanisms"]["ovs_datapath"] in ("user", "kernel")
    assert scale["mtu"] == 9000 and scale["roce_payload_bytes"] == 4096
    (run,) = doc["runs"]
    job = run["jobs"]["traffic"]
    assert job["kind"] == "all-pairs" and job["cpu"]["machine"] is not None
    assert job["cpu"]["ovs_forwarding"] is not None
    assert doc["valid"] == (max(job["cpu"].values()) < 0.9) == (proc.returncode == 0)
    # the link events are faults on the run's timeline: each struck where asked, within a tick
    down, up = run["faults"]
    assert (down["kind"], up["kind"]) == ("link_down", "link_up")
    assert down["at_s"] == pytest.approx(1.0, abs=0.1) and up["at_s"] == pytest.approx(2.5, abs=0.1)
    assert [e["event"] for e in down["events"]] == ["l1-s1 down"]
    assert [e["event"] for e in run["events"]] == ["link_down", "link_up"]
    assert job["traffic"]["flows"] == 8 and job["traffic"]["received_packets"] > 0
    # what `run --format perftest` prints of this document: a block per flow, as ib_write_bw's
    assert (job["message_bytes"], job["payload_bytes"]) == (65536, 4096)
    blocks = parse_perftest(perftest.render(doc))
    assert len(blocks) == 8 and all(b["bytes"] == 65536 and b["bw_peak"] == 0.0 for b in blocks)
    assert sum(b["iterations"] for b in blocks) == sum(f["received_packets"] // 16 for f in job["flows"]) > 0
    assert {row["link"] for row in job["links"]} == {"l1-s1", "l1-s2", "l2-s1", "l2-s2"}
    assert job["balance"]["up"]["max_mean_ratio"] >= 1.0
    # what report renders, and what the heatmap shows: l1 sent nothing up to s1 while it was down
    assert (tmp_path / "report.md").read_text().startswith("# tiny (run)")
    assert (tmp_path / f"heatmap-{run['slug']}.png").stat().st_size > 10_000
    assert labutil.leaked(before, labutil.resources()) == {}
    folders["run"] = tmp_path


def test_up_prompt_runs_lab_commands(tmp_path):
    script = "\n".join([
        "paths h1 h2",
        "linkdown l1 s1",
        "paths h1 h2",
        "ctl",
        "linkup l1 s1",
        "ports l1",
        "linkdown l1 s9",          # a mistake gets a one-line error, the prompt goes on
        "h1 ping -c1 -W2 h2",
        "uplinks 0.5",
        "exit",
    ]) + "\n"
    path = tmp_path / "session.txt"
    path.write_text(script)
    before = labutil.resources()
    proc = subprocess.run(FABRICLAB + ["up", "tiny", "--script", str(path)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr     # Mininet prints node commands' output on stderr
    assert "2 equal-cost path(s) from h1-n0 (10.1.1.1) to h2-n0 (10.1.2.1)" in out
    assert "1 equal-cost path(s)" in out
    assert "l1-s1 down; controller reprogrammed" in out and "l1-s1 up; controller reprogrammed" in out
    assert "down: l1:2 - s1:1" in out
    assert "l1-eth1" in out and "buffer drops" in out
    assert "error: no node 's9'" in out
    assert "1 received" in out
    assert "max/mean" in out
    assert "fabric torn down" in out
    assert labutil.leaked(before, labutil.resources()) == {}


def test_collective_command_writes_results_and_charts(tmp_path, folders):
    proc = subprocess.run(FABRICLAB + ["collective", "tiny", "--sizes", "64K,128K", "-n", "2",
                                       "--verify", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "allreduce/ring over 2 ranks on tiny" in proc.stdout and "ok" in proc.stdout
    doc = document.load(tmp_path)
    assert doc["kind"] == "collective" and doc["scale"]["time_scale"] == 40000
    sizes = doc["runs"][0]["jobs"]["allreduce"]["sizes"]
    assert [row["size"] for row in sizes] == [65536, 131072]
    assert all(row["verify"]["ok"] for row in sizes)
    for chart in ("busbw.png", "cct.png", f"heatmap-{doc['runs'][0]['slug']}.png"):
        assert (tmp_path / chart).read_bytes().startswith(b"\x89PNG")
    assert "| allreduce | measured | allreduce/ring | 64K | 2 |" in (tmp_path / "report.md").read_text()
    folders["collective"] = tmp_path


def test_collective_prints_what_nccl_tests_prints(tmp_path):
    """--format nccl: stdout is nccl-tests' text alone (both modes, verified), which a parser of
    nccl-tests logs reads whole; the results folder is written and named on stderr."""
    proc = subprocess.run(FABRICLAB + ["collective", "tiny", "--sizes", "64K,128K", "-n", "2", "--verify",
                                       "--format", "nccl", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    log = parse(proc.stdout)                       # every line a `#` line or a 13-field row
    assert proc.stdout.startswith("# nThread 1 nGpus 1 minBytes 65536 maxBytes 131072 step: 2(factor) ")
    assert [r["size"] for r in log["rows"]] == [65536, 131072]
    assert all(field_ends(r["line"]) == FIELD_ENDS for r in log["rows"])
    assert all(r[mode]["wrong"] == 0 for r in log["rows"] for mode in MODES)
    assert log["out_of_bounds"] == (0, "OK")
    assert f"results: {tmp_path}/results.json" in proc.stderr
    doc = document.load(tmp_path)
    job = doc["runs"][0]["jobs"]["allreduce"]
    assert [(row["size"], row["in_place"]) for row in job["sizes"]] == \
        [(65536, False), (65536, True), (131072, False), (131072, True)]
    assert all(row["verify"]["ok"] and row["verify"]["wrong_elements"] == 0 for row in job["sizes"])
    assert [r["pid"] for r in log["ranks"]] == [r["pid"] for r in job["ranks"]] and all(r["pid"] for r in log["ranks"])
    scale = doc["scale"]["time_scale"]
    printed = [r[mode]["busbw"] for r in log["rows"] for mode in MODES]
    # printed to 2 decimals: off by at most half a hundredth, plus the float's own error
    assert printed == [pytest.approx(row["busbw_mbps"] * scale / 8e3, abs=0.0051) for row in job["sizes"]]
    assert log["avg_busbw"] == pytest.approx(sum(printed) / 4, rel=1e-3)


def test_report_and_compare_read_the_run_and_the_collective(folders, tmp_path):
    if set(folders) != {"run", "collective"}:
        pytest.skip("needs the run and collective folders of the tests above")
    proc = subprocess.run(FABRICLAB + ["report", str(folders["run"])], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("report.md"), proc.stderr
    proc = subprocess.run(FABRICLAB + ["compare", str(folders["run"]), str(folders["collective"]), "--format",
                                       "json"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [(r["kind"], r["job_kind"]) for r in rows] == [("run", "all-pairs"), ("collective", "collective"),
                                                          ("collective", "collective")]
    assert rows[0]["delivered_mbps"] > 0 and rows[1]["busbw_mbps"] > 0
    assert [r["kind"] for r in compare.collect([folders["run"], folders["collective"]])] == \
        ["run", "collective", "collective"]


def test_collective_command_rejects_bad_input_in_one_line():
    proc = subprocess.run(FABRICLAB + ["collective", "tiny", "--qps", "0"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "fabriclab: error: collective: qps must be in [1, 64], got 0"
