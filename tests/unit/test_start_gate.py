"""The common start of a run's agents (traffic/start_gate.py and its launcher side in
traffic/agent_process.py): ready on stdout, the start time on stdin here or in a start file on
another machine, and every way it can fail in one line. The lab tests run every traffic and
SwitchML job through it, and test_two_kernels a guest's agents."""

import io
import os
import subprocess
import sys
import time
import types

import pytest

from fabriclab.errors import LabError
from fabriclab.system import patience
from fabriclab.traffic import agent_process, start_gate


def pipe_with(data, close=True):
    r, w = os.pipe()
    os.write(w, data)
    if close:
        os.close(w)
    return r, w


def test_the_agent_says_ready_then_reads_its_start_time():
    out = io.StringIO()
    start = time.time() + 0.5
    r, _w = pipe_with(f"{start!r}\n".encode())
    try:
        assert start_gate.ready_then_start("w3", fd=r, out=out) == start
    finally:
        os.close(r)
    assert out.getvalue() == '{"ready": "w3"}\n'


@pytest.mark.parametrize("data, complaint", [
    (b"", "stdin ended before a start time came"),
    (b"soon\n", "not a number: 'soon'"),
    (b"nan\n", "not within 600 s of now"),
    (b"1e12\n", "not within 600 s of now"),
    (b"1" * 100, "not one short line"),
])
def test_a_missing_or_malformed_start_time_is_one_line(data, complaint):
    r, _w = pipe_with(data)
    try:
        with pytest.raises(start_gate.GateError, match=complaint):
            start_gate.read_start(fd=r)
    finally:
        os.close(r)


def test_a_stopped_agent_stops_waiting_and_a_silent_launcher_times_out():
    r, w = pipe_with(b"", close=False)
    try:
        t0 = time.monotonic()
        assert start_gate.read_start(fd=r, stopped=lambda: time.monotonic() - t0 > 0.2) is None
        with pytest.raises(start_gate.GateError, match="no start time on stdin within 0 s"):
            start_gate.read_start(fd=r, limit_s=0.3)
        os.close(w)
        # told to stop, then its input closed (the launcher's order when it cancels): no error
        assert start_gate.read_start(fd=r, stopped=lambda: True) is None
    finally:
        os.close(r)


def agent(script):
    """A stand-in agent: python -c script, with the gate's pipes."""
    return subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


GATED = ("import sys, time; from fabriclab.traffic import start_gate; "
         "t = start_gate.ready_then_start('a'); print(round(t - time.time(), 3), flush=True)")


def test_release_gives_every_ready_agent_one_start_time_just_ahead():
    procs = [agent(GATED) for _ in range(3)]
    try:
        for i, proc in enumerate(procs):
            agent_process.wait_ready(proc, f"agent {i}", time.monotonic() + 60)
        start = agent_process.release(procs, margin_s=0.5)
        ahead = [float(proc.communicate(timeout=30)[0].decode().split()[-1]) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert abs(start - time.time()) < 5
    assert all(0.3 < a <= 0.5 for a in ahead), ahead     # read at once, and all the same start


def test_release_outlives_an_agent_that_died_after_it_said_ready():
    dead = agent("print('{\"ready\": \"d\"}', flush=True)")
    live = agent(GATED)
    try:
        for proc in (dead, live):
            agent_process.wait_ready(proc, "agent", time.monotonic() + 60)
        dead.wait(30)
        agent_process.release([dead, live])
        assert live.wait(30) == 0
    finally:
        for proc in (dead, live):
            proc.kill()
            proc.wait()


def saying(text):
    return agent(f"import sys; sys.stdout.write({text!r}); sys.stdout.flush(); sys.stdin.read()")


def test_an_agent_is_ready_when_it_says_so_and_its_later_output_is_kept():
    proc = saying('{"ready": "agg-l1"}\n{"counters": {"sent": 3}}\n')
    agent_process.wait_ready(proc, "agg-l1 on h4", time.monotonic() + 30)
    out, _err = proc.communicate(timeout=30)          # what came after the line is still there
    assert out == b'{"counters": {"sent": 3}}\n'


@pytest.mark.parametrize("said, complaint", [("", "ended before it was ready"),
                                             ('{"error": "bind"}\n', "not ready"),
                                             ("nonsense\n", "not ready")])
def test_an_agent_that_is_not_ready_fails_in_one_line(said, complaint):
    proc = saying(said)
    proc.stdin.close()
    with pytest.raises(LabError, match=complaint):
        agent_process.wait_ready(proc, "agg-l1 on h4", time.monotonic() + 30)
    proc.wait()


def test_an_agent_that_says_nothing_in_time_fails():
    proc = saying("")
    try:
        with pytest.raises(LabError, match="agg-l1 on h4 was not ready in time"):
            agent_process.wait_ready(proc, "agg-l1 on h4", time.monotonic() + 0.5)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("data, complaint", [
    (b"soon\n", "in the start file is not a number: 'soon'"),
    (b"inf\n", "not within 600 s of now"),
    (b"1" * 100, "not one short line"),
    (b"cancel\n", "the launcher called the start off"),
])
def test_a_malformed_or_called_off_start_file_is_one_line(tmp_path, data, complaint):
    (tmp_path / "a.start").write_bytes(data)
    with pytest.raises(start_gate.GateError, match=complaint):
        start_gate.read_start_file(tmp_path / "a.start")


def test_an_agent_waiting_for_its_start_file_stops_or_times_out(tmp_path):
    t0 = time.monotonic()
    assert start_gate.read_start_file(tmp_path / "a.start", stopped=lambda: time.monotonic() - t0 > 0.2) is None
    with pytest.raises(start_gate.GateError, match="no start file within 0 s"):
        start_gate.read_start_file(tmp_path / "a.start", limit_s=0.2)


class Elsewhere:
    """A lab whose cluster puts h2 on another machine, 0.25 s ahead of this one's clock. Its
    commands run here: the start file lands where the agent, here too, looks for it. Its agent
    module, `gatedagent`, is `source`."""

    OFFSET_S = 0.25

    def __init__(self, folder, source):
        self.scripts = []
        (folder / "gatedagent.py").write_text(source)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), *sys.path])}
        self.run = types.SimpleNamespace(path=lambda name: folder / name, add_process=lambda *a: None)
        self.cluster = types.SimpleNamespace(machine_of_name=self.machine_of_name, root_run=self.root_run,
                                             clock_offset_s=lambda machine: self.OFFSET_S)
        self.net = types.SimpleNamespace(get=lambda host: types.SimpleNamespace(
            popen=lambda argv, **kw: subprocess.Popen(argv, env=env, **kw)))

    @staticmethod
    def machine_of_name(host):
        return types.SimpleNamespace(name="guest", local=False, python=sys.executable) if host == "h2" else None

    def root_run(self, machine, script, what, stdin_text=None):
        self.scripts.append(script)
        subprocess.run(["bash", "-ec", script], check=True)


def test_an_agent_on_another_machine_reads_its_start_from_a_file_on_that_machines_clock(tmp_path):
    lab = Elsewhere(tmp_path, "import sys, time\nfrom fabriclab.traffic import start_gate\n"
                    "path = sys.argv[sys.argv.index(start_gate.FILE_FLAG) + 1] if start_gate.FILE_FLAG in sys.argv else None\n"
                    "t = start_gate.ready_then_start('a', path=path)\n"
                    "print(round(t - time.time(), 3), flush=True)\n")
    procs = {h: agent_process.start(lab, h, "gatedagent", [], "agent", gate=True) for h in ("h1", "h2")}
    try:
        # started with stdin here, and with a start file of its own over there
        assert procs["h1"].start_file is None and procs["h2"].stdin is None
        _cluster, machine, path, offset = procs["h2"].start_file
        assert machine.name == "guest" and offset == Elsewhere.OFFSET_S and path.parent == tmp_path / "gates"
        for proc in procs.values():
            agent_process.wait_ready(proc, "agent", time.monotonic() + 60)
        start = agent_process.release(list(procs.values()), margin_s=0.5)
        ahead = {h: float(proc.communicate(timeout=30)[0].decode().split()[-1]) for h, proc in procs.items()}
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
    go = 0.5 + agent_process.REMOTE_GO_S * patience.factor()
    agent_process.call_off(list(procs.values()))            # released: nothing to call off
    assert abs(start - time.time()) < 5 and len(lab.scripts) == 1 and path.exists()
    # both wait for the one start: the one over there on its own clock, the offset later here
    assert go - 0.4 < ahead["h1"] <= go, ahead
    assert abs(ahead["h2"] - ahead["h1"] - Elsewhere.OFFSET_S) < 0.1, ahead


def test_a_run_that_fails_before_the_start_calls_off_the_agents_waiting_over_there(tmp_path):
    lab = Elsewhere(tmp_path, "import sys\nfrom fabriclab.traffic import start_gate\n"
                    "try:\n    start_gate.ready_then_start('a', path=sys.argv[sys.argv.index(start_gate.FILE_FLAG) + 1])\n"
                    "except start_gate.GateError as exc:\n    sys.exit(str(exc))\n")
    proc = agent_process.start(lab, "h2", "gatedagent", [], "agent", gate=True)
    try:
        agent_process.wait_ready(proc, "agent", time.monotonic() + 60)
        agent_process.call_off([proc])
        assert proc.wait(30) == 1 and b"the launcher called the start off" in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
