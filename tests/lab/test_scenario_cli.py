"""Scenarios and faults from the command line: Ctrl-C during a scenario leaves nothing behind, and
the prompt's failure commands (switch, slow receiver, controller restart, fault log, live view) work."""

import signal
import subprocess
import sys
import time

import pytest

from tests.lab import labutil

pytestmark = pytest.mark.lab

FABRICLAB = [sys.executable, "-m", "fabriclab.cli.main"]


def test_ctrl_c_during_a_scenario_leaves_nothing_behind(tmp_path):
    before = labutil.resources()
    path = tmp_path / "long.yaml"
    path.write_text("name: long\nspec: tiny\nduration_s: 30\n"
                    "jobs: [{name: ring, collective: allreduce, sizes: [256K]}]\n"
                    "faults: [{at: 1, flap: l1-s1, count: 5, down: 1, up: 1}]\n")
    proc = subprocess.Popen(FABRICLAB + ["scenario", "run", str(path), "--out", str(tmp_path / "out")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=labutil.sigint_as_at_a_terminal)
    try:
        deadline = time.monotonic() + 90
        while not any("fabriclab.traffic.agent" in cmd for _pid, cmd in labutil.lab_processes()):
            assert time.monotonic() < deadline, "the scenario's agents never started"
            time.sleep(0.1)
        time.sleep(2.0)                                 # into the fault timeline
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err, err
    assert labutil.leaked(before, labutil.resources()) == {}


def test_failure_commands_at_the_prompt(tmp_path):
    script = tmp_path / "session.txt"
    script.write_text("switchdown s1\nslow h2 0.5\nloss l2 s2 0.5\nfaults\ntop 1 0.5\nrestartctl\n"
                      "faults restore\nswitchup s1\nh1 ping -c 1 -W 2 10.1.2.1\n")
    proc = subprocess.run(FABRICLAB + ["up", "tiny", "--script", str(script)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "s1 down (2 cables)" in out and "h2 receives at 0.5 of its line rate" in out
    assert "l2-s2: 50.000% of packets lost each way" in out and "lossy l2-s2 (0.5)" in out
    assert "switch_down" in out and "slow_receiver" in out and "loss" in out   # the fault log
    assert "fabriclab top: tiny" in out and "l1 uplinks" in out        # the live view
    assert "controller ecmp restarted" in out and "every link up, at its spec rate and without loss" in out
    assert "1 received" in out and "error" not in out.lower()


def test_a_scenario_on_a_queue_model_spec_records_and_plots_its_queues(tmp_path, run_scenario):
    spec = tmp_path / "pfc.yaml"
    spec.write_text("name: scq\nkind: leafspine\nleaves: 2\nspines: 1\nhosts_per_leaf: 2\nnics_per_host: 1\n"
                    "host_rate: 10Mbit\nfabric_rate: 10Mbit\nqueues: {pfc: {enabled: true, watchdog_ms: 0}}\n")
    doc = run_scenario({"name": "incast", "spec": str(spec),
                        "jobs": [{"name": "gather", "collective": "gather", "sizes": ["256K"],
                                  "hosts": ["h2", "h1", "h3", "h4"], "iterations": 2, "warmup": 0}]})
    run = doc["runs"][0]
    folder = tmp_path / "scenario"
    assert (folder / run["files"]["queues_csv"]).stat().st_size > 0
    assert (folder / run["files"]["queues_plot"]).read_bytes().startswith(b"\x89PNG")
    assert any(row["pause_tx"] > 0 for row in run["queues"]["summary"])     # 3:1 into h2 pauses upstream
    assert run["files"]["queues_plot"] in (folder / "report.md").read_text()
