"""The port sampler of another machine, without another machine: its input checked as hostile, its
protocol run end to end through `sh -c` in place of SSH (reading this machine's loopback), the
other clock's offset, and a remote series set onto this machine's sample times."""

import io
import json
import sys
import types

import numpy as np
import pytest

from fabriclab.errors import LabError
from fabriclab.cluster import remotesampler
from fabriclab.measure import grid
from fabriclab.measure.portsampler import columns, machines_of_columns
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec


def run_main(monkeypatch, lines, interval="0.001"):
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(line + "\n" for line in lines)))
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    code = remotesampler.main(["--interval", interval])
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.mark.parametrize("line", [
    "not json", "[]", '{"pairs": []}', '{"pairs": [["lo"]]}', '{"pairs": [["../../etc", "tx_bytes"]]}',
    '{"pairs": [["lo", "tx_bytes/../x"]]}', '{"pairs": [["a-name-far-too-long", "tx_bytes"]]}',
    '{"pairs": [["lo", 3]]}',
])
def test_a_bad_request_is_refused_before_anything_is_read(monkeypatch, line):
    code, said = run_main(monkeypatch, [line])
    assert code == 2 and said == [{"error": "expected a list of [interface, counter] pairs and an interval >= 1 ms"}]


def test_a_port_missing_on_that_machine_is_named(monkeypatch):
    code, said = run_main(monkeypatch, [json.dumps({"pairs": [["lo", "tx_bytes"], ["nope0", "rx_bytes"]]})])
    assert code == 1 and said == [{"error": "no port(s) nope0 on this machine"}]


def test_it_samples_answers_the_clock_and_returns_its_series(monkeypatch):
    pairs = [["lo", "tx_bytes"], ["lo", "rx_packets"]]
    code, said = run_main(monkeypatch, [json.dumps({"pairs": pairs}), "clock", "stop"])
    assert code == 0
    assert said[0] == {"ready": said[0]["ready"]} and isinstance(said[1]["wall"], float)
    result = said[2]
    assert result["error"] is None and len(result["times"]) == len(result["rows"]) >= 2
    assert all(len(row) == 2 and all(isinstance(v, int) for v in row) for row in result["rows"])


def local_machine(python=sys.executable):
    """A Machine stand-in whose 'SSH' is `sh -c` here."""
    return types.SimpleNamespace(name="other", python=python, ssh_argv=lambda: ["sh", "-c"])


def test_the_sampler_here_runs_the_protocol_and_sets_the_other_clock_onto_this_one():
    recorded = []
    sampler = remotesampler.RemoteSampler(local_machine(), [("lo", "tx_bytes")], 0.002, recorded.append)
    sampler.start()
    assert len(recorded) == 1 and isinstance(recorded[0], int)
    assert abs(sampler.offset_s) < 0.05 and 0 < sampler.rtt_s < 1.0      # the same clock, here
    walls, rows = sampler.stop()
    assert len(walls) == len(rows) >= 1 and walls == sorted(walls)
    assert sampler.proc.returncode == 0


def test_a_sampler_that_cannot_start_is_one_line():
    machine = local_machine(python="/nonexistent/python")
    with pytest.raises(LabError, match="port sampler on other: ") as err:
        remotesampler.RemoteSampler(machine, [("lo", "tx_bytes")], 0.002).start()
    assert "\n" not in str(err.value)


def test_a_remote_series_is_interpolated_onto_the_local_times_by_wall_clock():
    # remote counters at walls 100.0, 100.1, 100.2 (bytes 0, 1000, 3000); local series from wall 100.05
    got = grid.onto([0.0, 0.05, 0.1, 0.2], 100.05, [100.0, 100.1, 100.2], [[0], [1000], [3000]])
    assert got.dtype == np.int64 and got[:, 0].tolist() == [500, 1000, 2000, 3000]


class FakeCluster:
    def __init__(self, away):
        self.away = away

    def machine_of_name(self, name):
        return types.SimpleNamespace(name="m2" if name in self.away else "m1", local=name not in self.away)


def test_columns_of_switches_on_other_machines_are_grouped_by_machine():
    fabric = Fabric(load_spec("tiny"))
    cols = columns(fabric)
    away = machines_of_columns(fabric, cols, FakeCluster({"l2", "s2"}))
    assert list(away) == ["m2"]
    read_there = {cols[i].intf for i in away["m2"][1]}
    owners = {link.a_intf: link.a for link in fabric.links} | {link.b_intf: link.b for link in fabric.links}
    assert read_there and all(owners[intf] in ("l2", "s2") for intf in read_there)
    assert all(owners[c.intf] not in ("l2", "s2") for i, c in enumerate(cols) if i not in away["m2"][1])


def test_the_other_clocks_drift_over_the_run_is_taken_off_linearly():
    sampler = remotesampler.RemoteSampler(local_machine(), [("lo", "tx_bytes")], 0.002)
    # its clock was 1.0 s ahead at the start and 1.2 s ahead at the end, 10 s later here
    sampler.offset_s, sampler.end_offset_s = 1.0, 1.2
    walls = sampler._here(101.0, [0.0, 5.0, 10.0], ended=110.0)
    assert walls == pytest.approx([100.0, 104.9, 109.8])
    sampler.end_offset_s = 1.0
    assert sampler._here(101.0, [0.0, 10.0], ended=110.0) == pytest.approx([100.0, 110.0])
