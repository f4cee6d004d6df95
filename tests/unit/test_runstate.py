"""The run registry in a temporary folder: records written at once, read back, listed, and judged live.

RUN_ROOT is read when fabriclab.lab.runstate is imported, so each test points the module's global at
its own tmp_path; nothing under /run is touched.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from fabriclab.lab import runstate
from fabriclab.system import procs
from fabriclab.lab.runstate import RunState


@pytest.fixture(autouse=True)
def run_root(tmp_path, monkeypatch):
    monkeypatch.setattr(runstate, "RUN_ROOT", tmp_path)
    return tmp_path


def on_disk(state):
    return json.loads((state.dir / "state.json").read_text())


def test_create_writes_the_record_before_anything_else(run_root):
    state = RunState.create("tiny")
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", state.id)
    assert state.dir == run_root / "runs" / state.id
    data = on_disk(state)
    assert data["id"] == state.id and data["spec"] == "tiny"
    assert data["pid"] == os.getpid()
    assert data["cmdline"] == procs.pid_cmdline(os.getpid())
    assert (data["bridges"], data["interfaces"], data["processes"]) == ([], [], [])
    assert not (state.dir / "state.json.tmp").exists()


def test_two_runs_get_two_folders():
    a, b = RunState.create("tiny"), RunState.create("tiny")
    assert a.id != b.id and a.dir != b.dir


def test_plan_merges_sorts_and_persists():
    state = RunState.create("default")
    state.plan(["l2", "l1"], ["l1-eth2"])
    state.plan(["l1", "s1"], ["l1-eth1"])
    assert state.data["bridges"] == ["l1", "l2", "s1"]
    assert state.data["interfaces"] == ["l1-eth1", "l1-eth2"]
    assert on_disk(state)["bridges"] == ["l1", "l2", "s1"]
    assert on_disk(state)["interfaces"] == ["l1-eth1", "l1-eth2"]


def test_add_process_persists_in_order():
    state = RunState.create("default")
    state.add_process(4242, "controller", "fabriclab.apps.runner")
    state.add_process(4343, "traffic-agent", "fabriclab.traffic.generator")
    assert on_disk(state)["processes"] == [
        {"pid": 4242, "role": "controller", "match": "fabriclab.apps.runner"},
        {"pid": 4343, "role": "traffic-agent", "match": "fabriclab.traffic.generator"},
    ]


def test_load_round_trip():
    state = RunState.create("tiny")
    state.plan(["l1"], ["l1-eth1"])
    state.add_process(99, "mininet-shell", "mininet:h1")
    loaded = RunState.load(state.dir)
    assert loaded.id == state.id and loaded.dir == state.dir
    assert loaded.data == state.data
    loaded.plan(["s1"], [])             # a loaded record keeps persisting
    assert RunState.load(str(state.dir)).data["bridges"] == ["l1", "s1"]


def test_path_is_inside_the_run_folder():
    state = RunState.create("tiny")
    assert state.path("controller.log") == state.dir / "controller.log"


def test_all_without_a_runs_folder_is_empty():
    assert RunState.all() == []


def test_all_lists_runs_and_marks_corrupt_records(run_root):
    good = sorted([RunState.create("tiny"), RunState.create("default")], key=lambda s: s.id)
    broken = run_root / "runs" / "99999999-000000-bad"
    broken.mkdir()
    (broken / "state.json").write_text("{ not json")
    empty = run_root / "runs" / "99999999-000001-empty"      # killed between mkdir and save
    empty.mkdir()
    no_id = run_root / "runs" / "99999999-000002-noid"
    no_id.mkdir()
    (no_id / "state.json").write_text(json.dumps({"pid": 1}))

    runs = RunState.all()
    assert [r.id for r in runs] == [good[0].id, good[1].id, broken.name, empty.name, no_id.name]
    assert [r.data["spec"] for r in runs[:2]] == [good[0].data["spec"], good[1].data["spec"]]
    assert not any(r.data.get("corrupt") for r in runs[:2])
    for corrupt in runs[2:]:
        assert corrupt.data["corrupt"] is True
        assert corrupt.dir.name == corrupt.id
        assert (corrupt.data["bridges"], corrupt.data["processes"]) == ([], [])
        assert corrupt.live is False


def test_remove_deletes_only_its_folder():
    keep, gone = RunState.create("a"), RunState.create("b")
    gone.remove()
    assert not gone.dir.exists() and keep.dir.exists()
    assert [r.id for r in RunState.all()] == [keep.id]
    gone.remove()                       # twice is harmless


# -- live -----------------------------------------------------------------------------------------

def test_a_run_of_this_process_is_live():
    assert RunState.create("tiny").live is True


def test_a_run_whose_process_is_dead_is_not_live():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    state = RunState.create("tiny")
    state.data["pid"] = proc.pid
    assert procs.pid_alive(proc.pid) is False
    assert state.live is False


def test_a_recycled_pid_with_another_command_line_is_not_live():
    state = RunState.create("tiny")
    state.data["cmdline"] = "python -m something-else "
    assert state.live is False


def test_a_live_pid_running_another_program_is_not_live():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    try:
        state = RunState.create("tiny")
        state.data["pid"] = proc.pid          # alive, but not the command line recorded
        assert procs.pid_alive(proc.pid) is True
        assert state.live is False
        state.data["cmdline"] = procs.pid_cmdline(proc.pid)
        assert state.live is True
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


@pytest.mark.parametrize("pid", [None, 0])
def test_a_record_without_a_pid_is_not_live(pid):
    state = RunState.create("tiny")
    state.data["pid"] = pid
    assert state.live is False


def test_pid_cmdline_of_this_process_and_of_no_process():
    line = procs.pid_cmdline(os.getpid())
    assert "python" in line.split(" ")[0]
    assert "\0" not in line and line.endswith(" ")     # argv joined by spaces, NULs replaced
    assert procs.pid_cmdline(2**22 + 1) is None    # above any pid_max
