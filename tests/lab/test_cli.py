"""The command line end to end: `run` with link events writes honest results; `up` drives a prompt."""

import json
import subprocess
import sys

import pytest

from tests.lab import labutil

pytestmark = pytest.mark.lab

FABRICLAB = [sys.executable, "-m", "fabriclab.cli.main"]


def test_run_with_a_link_failure_writes_results_with_scale(tmp_path):
    before = labutil.resources()
    proc = subprocess.run(FABRICLAB + ["run", "tiny", "--duration", "4", "--flows-per-pair", "4",
                                       "--link-down", "l1-s1@1", "--link-up", "l1-s1@2.5",
                                       "--out", str(tmp_path), "--format", "json"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode in (0, 1), proc.stderr     # 1: valid but CPU-saturated run
    doc = json.loads(proc.stdout)
    assert json.loads((tmp_path / "results.json").read_text()) == doc
    scale = doc["scale"]
    assert scale["host_rate_mbps"] == 10 and scale["fabric_rate_mbps"] == 10
    assert scale["buffers_bytes"] == {"host": 65536, "leaf": 65536, "spine": 262144}
    assert scale["time_scale"] == pytest.approx(40000)
    assert doc["mechanisms"]["ovs_datapath"] in ("user", "kernel")
    assert doc["cpu"]["machine"] is not None and doc["cpu"]["ovs_forwarding"] is not None
    assert doc["valid"] == (max(doc["cpu"].values()) < 0.9)
    assert scale["mtu"] == 9000 and scale["roce_payload_bytes"] == 4096
    assert [(a["at_s"], a["outcome"]["up"]) for a in doc["actions"]] == [(1.0, False), (2.5, True)]
    assert doc["traffic"]["flows"] == 8 and doc["traffic"]["received_packets"] > 0
    assert {row["link"] for row in doc["links"]} == {"l1-s1", "l1-s2", "l2-s1", "l2-s2"}
    assert doc["balance"]["up"]["max_mean_ratio"] >= 1.0
    assert labutil.leaked(before, labutil.resources()) == {}


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


def test_collective_command_writes_results_and_charts(tmp_path):
    proc = subprocess.run(FABRICLAB + ["collective", "tiny", "--sizes", "64K,128K", "-n", "2",
                                       "--verify", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "allreduce/ring over 2 ranks on tiny" in proc.stdout and "ok" in proc.stdout
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["kind"] == "collective" and doc["scale"]["time_scale"] == 40000
    assert [row["size"] for row in doc["sizes"]] == [65536, 131072]
    assert all(row["verify"]["ok"] for row in doc["sizes"])
    for chart in ("busbw.png", "cct.png"):
        assert (tmp_path / chart).read_bytes().startswith(b"\x89PNG")


def test_collective_command_rejects_bad_input_in_one_line():
    proc = subprocess.run(FABRICLAB + ["collective", "tiny", "--qps", "0"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "fabriclab: error: collective: qps must be a whole number >= 1, got 0"
