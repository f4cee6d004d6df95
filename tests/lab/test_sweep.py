"""Sweeps on real fabrics: every case of a sweep file run here into one folder and resumed after a
lost case, and the same cases spread over an inventory where one machine cannot be reached (its
case runs on the other), compared in one table with a plot per parameter."""

import json
import pathlib
import subprocess
import sys

import pytest

from tests.lab import labutil

pytestmark = pytest.mark.lab

REPO = pathlib.Path(__file__).resolve().parents[2]
FABRICLAB = [sys.executable, "-m", "fabriclab.cli.main"]
EXAMPLE = REPO / "examples" / "sweeps" / "qps_by_routing.yaml"


def sweep(*args, timeout=600):
    return subprocess.run(FABRICLAB + ["sweep", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def states(folder):
    return {c["id"]: (c["state"], c["machine"]) for c in json.loads((folder / "sweep.json").read_text())["cases"]}


def test_a_sweep_runs_here_and_resumes_what_was_lost(tmp_path):
    before = labutil.resources()
    spec = tmp_path / "two.yaml"
    spec.write_text(EXAMPLE.read_text().split("\nsweep:")[0] + "\nsweep:\n  jobs.ring.qps: [1, 2]\n")
    out = tmp_path / "here"
    proc = sweep(spec, "--out", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = states(out)
    assert [s for s, _m in first.values()] == ["done", "done"]
    assert "busbw Mbit/s" in proc.stdout and (out / "sweep-jobs.ring.qps.png").stat().st_size > 5_000
    lost = sorted(first)[1]
    (out / "cases" / lost / "results.json").unlink()              # as if that case had been killed
    again = sweep(spec, "--out", out)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1 of 2 case(s) already done" in again.stdout
    assert again.stdout.count("running here") == 1 and f"{lost} (jobs.ring.qps=2): running here" in again.stdout
    assert labutil.leaked(before, labutil.resources()) == {}


def test_a_sweep_over_an_inventory_reruns_a_lost_machines_case_elsewhere(tmp_path):
    before = labutil.resources()
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(
        "[lab]\n"
        "localhost ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n"
        "gone ansible_host=127.0.0.1 ansible_port=9 ansible_user=nobody\n"     # nothing listens there
        f"[lab:vars]\nproject_dir={REPO}\nvenv_dir={sys.prefix}\n")
    out = tmp_path / "fanned"
    proc = sweep(EXAMPLE, "--out", out, "--inventory", inventory)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gone unreachable" in proc.stdout and "drops out, the case goes to another machine" in proc.stdout
    final = states(out)
    assert len(final) == 4 and set(final.values()) == {("done", "localhost")}
    for case in final:
        doc = json.loads((out / "cases" / case / "results.json").read_text())
        assert doc["valid"] and doc["scale"]["host_rate_mbps"] == 10
    table = proc.stdout.split("per case", 1)[1]
    assert table.count("localhost") == 4 and "flowlet" in table and "ecmp" in table
    assert (out / "sweep-routing.png").is_file() and (out / "sweep-jobs.ring.qps.png").is_file()
    assert not pathlib.Path("/var/tmp/fabriclab-sweep").exists() or not any(
        pathlib.Path("/var/tmp/fabriclab-sweep").iterdir())
    assert labutil.leaked(before, labutil.resources()) == {}
