"""An agent's files on a host of another machine, without another machine: its input copied there
with an earlier output removed first, its output read back from there, bounded; the traffic
agent's start time given on its command line over its config's; late starts reported."""

import base64
import json
import pathlib
import types

import pytest

from fabriclab.errors import LabError
from fabriclab.cluster.cluster import Cluster
from fabriclab.traffic import agent_process, generator
from fabriclab.traffic.launcher import TrafficRun


class RecordingCluster:
    """h2 on machine m2; push and pull recorded instead of run over SSH."""

    def __init__(self, files):
        self.files, self.pushed = files, []
        self.m2 = types.SimpleNamespace(name="m2", local=False)

    def machine_of_name(self, name):
        return self.m2 if name == "h2" else types.SimpleNamespace(name="here", local=True)

    def push(self, machine, path, text, remove=()):
        self.pushed.append((machine.name, path.name, text, [p.name for p in remove]))

    def pull(self, machine, path, limit, binary=False):
        data = self.files[path.name][:limit]
        return data.encode() if binary else data


def test_a_host_here_reads_and_writes_its_own_files_and_one_there_goes_over_the_cluster(tmp_path):
    cfg, out = tmp_path / "h.json", tmp_path / "h.result.json"
    cfg.write_text("{}")
    out.write_text("stale")
    cluster = RecordingCluster({"h.result.json": '{"sent": {}}'})
    lab = types.SimpleNamespace(cluster=cluster)
    agent_process.prepare(lab, "h1", [cfg], [out])
    assert not out.exists() and cluster.pushed == []              # here: the stale output is gone
    agent_process.prepare(lab, "h2", [cfg], [out])
    assert cluster.pushed == [("m2", "h.json", "{}", ["h.result.json"])]
    assert agent_process.read_output(lab, "h2", out, 1 << 20) == '{"sent": {}}'
    with pytest.raises(OSError):
        agent_process.read_output(lab, "h1", out, 1 << 20)        # none here
    assert agent_process.read_output(types.SimpleNamespace(), "h1", cfg, 10) == "{}"   # no cluster at all


def replying(stdout, returncode=0, stderr=""):
    """A machine whose every command prints `stdout`."""
    return types.SimpleNamespace(name="m2", run=lambda command, timeout: types.SimpleNamespace(
        returncode=returncode, stdout=stdout, stderr=stderr))


def test_pull_brings_text_or_bytes_back_unchanged_as_base64():
    cluster = Cluster.__new__(Cluster)
    tensor = bytes(range(256)) * 3
    assert cluster.pull(replying(base64.b64encode(tensor).decode() + "\n"), pathlib.Path("/run/o.npy"),
                        1024, binary=True) == tensor
    assert cluster.pull(replying(base64.b64encode("{\"µ\": 1}".encode()).decode()), pathlib.Path("/run/r.json"),
                        100) == '{"µ": 1}'
    with pytest.raises(LabError, match="copying r.json back from m2: not UTF-8 text"):
        cluster.pull(replying(base64.b64encode(b"\xff\xfe").decode()), pathlib.Path("/run/r.json"), 100)
    with pytest.raises(LabError, match="copying r.json back from m2: not what was sent"):
        cluster.pull(replying("not base64 !"), pathlib.Path("/run/r.json"), 100)


def test_pull_refuses_an_output_larger_than_its_bound_and_names_the_machine():
    machine = replying(base64.b64encode(b"x" * 11).decode())
    cluster = Cluster.__new__(Cluster)
    with pytest.raises(LabError, match="copying r.json back from m2: larger than 10 bytes"):
        cluster.pull(machine, pathlib.Path("/run/r.json"), 10)
    machine.run = lambda command, timeout: types.SimpleNamespace(returncode=1, stdout="",
                                                                 stderr="head: cannot open '/run/r.json'\n")
    with pytest.raises(LabError, match="copying r.json back from m2: head: cannot open"):
        cluster.pull(machine, pathlib.Path("/run/r.json"), 10)


def test_the_command_lines_start_time_replaces_the_configs(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"listen": True, "flows": [], "start_at": None, "duration_s": 1}))
    assert generator.load_config(path).start_at is None
    import time
    at = time.time() + 5
    assert generator.load_config(path, at).start_at == at
    with pytest.raises(LabError, match="start_at is .* in the future"):
        generator.load_config(path, time.time() + 10 * generator.MAX_START_DELAY_S)


def test_agents_that_began_late_are_reported_with_how_late():
    run = TrafficRun({}, 5.0, 0.0)
    run.results = {"h1": {"late_start_s": 0.0}, "h2": {"late_start_s": 1.23456}, "h3": {"late_start_s": 0.01},
                   "h4": {}, "h5": {"late_start_s": "soon"}}
    assert run.late_starts() == {"h2": 1.235}
