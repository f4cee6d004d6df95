"""Counters of another machine read by a reader that lives there, without another machine: its
requests checked as hostile, its protocol run end to end through `sh -c` in place of SSH (reading
this machine's loopback), replies checked as hostile, a reading dated by when it was taken, and a
snapshot whose other machine's ports are dated by their own reading (so rates over a window use
each port's own seconds)."""

import io
import json
import sys
import time
import types

import pytest

from fabriclab.errors import LabError
from fabriclab.cluster import remotecounters
from fabriclab.measure import telemetry
from fabriclab.measure.counters import PortCounters
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec


def tree(tmp_path, values):
    """/sys/class/net in miniature: {(intf, counter): value}."""
    for (intf, counter), value in values.items():
        folder = tmp_path / intf / "statistics"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / counter).write_text(f"{value}\n")
    return str(tmp_path)


def serve(monkeypatch, lines, sys_net):
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(line + "\n" for line in lines)))
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    code = remotecounters.main([], sys_net=sys_net)
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


def test_the_reader_answers_reads_in_order_with_the_time_it_read(monkeypatch, tmp_path):
    root = tree(tmp_path, {("l2-eth1", "tx_bytes"): 1234, ("s2-eth1", "tx_bytes"): 2 ** 63})
    (tmp_path / "l2-eth1" / "operstate").write_text("up\n")
    request = {"read": [["s2-eth1", "tx_bytes"], ["gone0", "tx_bytes"], ["l2-eth1", "tx_bytes"]], "states": True}
    before = time.time()
    code, said = serve(monkeypatch, ["clock", json.dumps(request)], root)
    assert code == 0 and said[0]["ready"] > 0 and said[1]["wall"] >= before
    reply = said[2]
    assert reply["values"] == [2 ** 63, None, 1234] and reply["states"] == {"l2-eth1": "up"}
    assert before <= reply["wall"] <= time.time() and "drops" not in reply


@pytest.mark.parametrize("line", [
    "not json", "[]", '{"read": []}', '{"read": [["lo"]]}', '{"read": [["../../etc", "tx_bytes"]]}',
    '{"read": [["lo", "tx_bytes/../x"]]}', '{"read": [["a-name-far-too-long", "tx_bytes"]]}',
    '{"read": [["lo", 3]]}', '{"read": [["lo", "tx_bytes"]], "drops": "yes"}',
    '{"read": [["lo", "tx_bytes"]], "shell": "rm -rf /"}',
])
def test_a_bad_request_is_answered_with_an_error_and_nothing_is_read(monkeypatch, line):
    code, said = serve(monkeypatch, [line, "clock"], "/nonexistent")
    assert code == 0 and "error" in said[1] and "wall" in said[2]      # and it goes on answering


def sh_machine(python=sys.executable):
    """A Machine stand-in whose 'SSH' is `sh -c` here."""
    return types.SimpleNamespace(name="other", python=python, ssh_argv=lambda: ["sh", "-c"])


def test_the_reader_here_runs_the_protocol_and_dates_a_reading_on_this_clock():
    recorded = []
    reader = remotecounters.CounterReader(sh_machine(), recorded.append).start()
    try:
        assert len(recorded) == 1 and abs(reader.offset_s) < 0.05
        t0 = time.monotonic()
        reading = reader.read([("lo", "tx_bytes"), ("lo", "rx_packets")], drops=True, states=True)
        assert t0 - 0.05 <= reading.time <= time.monotonic() + 0.05 and 0 < reading.error_s < 0.5
        assert all(isinstance(v, int) for v in reading.values) and set(reading.by_interface()) == {"lo"}
        assert isinstance(reading.drops, dict) and reading.states.get("lo") in ("unknown", "up")
        with pytest.raises(LabError, match="reading counters on other: not a list"):
            reader.read([("../etc", "tx_bytes")])
    finally:
        reader.close()
    assert reader.channel.proc.returncode == 0


def test_a_reader_that_cannot_start_is_one_line():
    with pytest.raises(LabError, match="counter reader on other: ") as err:
        remotecounters.CounterReader(sh_machine(python="/nonexistent/python")).start()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("reply", [
    {"wall": "now", "values": [1]}, {"wall": 1.0, "values": [1, 2]}, {"wall": 1.0, "values": ["1"]},
    {"wall": 1.0, "values": [-1]}, {"wall": 1.0, "values": [True]}, {"wall": 1.0, "values": [1 << 64]},
    {"wall": 1.0, "values": [1], "drops": [3]}, {"error": "no such thing"},
])
def test_a_reply_that_is_not_the_counters_asked_for_is_refused(reply):
    reader = remotecounters.CounterReader(types.SimpleNamespace(name="m2"))
    with pytest.raises(LabError, match="reading counters on m2: "):
        reader._reading([("l2-eth1", "tx_bytes")], reply, True, False, 0.0, 0.001)


def test_a_reading_is_dated_when_the_other_machine_took_it_not_when_it_arrived():
    reader = remotecounters.CounterReader(types.SimpleNamespace(name="m2"))
    taken = time.time() - 2.0                               # read 2 s ago, on this clock
    # its clock runs 100 s ahead, measured within 2 ms
    reading = reader._reading([("l2-eth1", "tx_bytes")], {"wall": taken + 100.0, "values": [5]}, False, False,
                              100.0, 0.002)
    assert reading.time == pytest.approx(time.monotonic() - 2.0, abs=0.01) and reading.error_s == 0.002


def test_an_offset_is_measured_again_once_it_is_old():
    now = [0.0]
    reader = remotecounters.CounterReader(types.SimpleNamespace(name="m2"), clock=lambda: now[0])
    offsets = iter([(0.5, 0.01), (0.7, 0.02)])
    reader.channel = types.SimpleNamespace(clock_offset=lambda: next(offsets))
    assert reader.offset() == (0.5, 0.005)
    now[0] = remotecounters.OFFSET_MAX_AGE_S - 1
    assert reader.offset() == (0.5, 0.005)
    now[0] = remotecounters.OFFSET_MAX_AGE_S + 1
    assert reader.offset() == (0.7, 0.01)


class TreeReader:
    """A reader of `root` as another machine's /sys/class/net, dated 1 s later than now."""

    def __init__(self, root):
        self.root, self.asked = root, []

    def read(self, pairs, drops=False, states=False):
        self.asked.append(list(pairs))
        with PortCounters(pairs, self.root) as counters:
            values = counters.read()
        return remotecounters.Reading(list(pairs), values, time.monotonic() + 1.0, 0.003,
                                      {} if drops else None, {} if states else None)


class SplitCluster:
    """l2 and s2 on machine m2, read by `reader`; the rest here."""

    def __init__(self, reader):
        self.m2 = types.SimpleNamespace(name="m2", local=False)
        self.reader, self.started = reader, 0

    def machine_of_name(self, name):
        return self.m2 if name in ("l2", "s2") else types.SimpleNamespace(name="here", local=True)

    def helper(self, machine, key, start):
        assert machine is self.m2 and key == remotecounters.MODULE
        return self.reader

    def read_counters_all(self, by_machine, drops=False):
        return remotecounters.read_all(self, by_machine, drops)


def test_a_snapshot_reads_the_other_machines_ports_there_and_dates_them(tmp_path):
    fabric = Fabric(load_spec("tiny"))
    there = {intf for s in ("l2", "s2") for intf in fabric.switch_ports(s).values()}
    reader = TreeReader(tree(tmp_path / "m2", {(intf, c): 1000 for intf in there for c in telemetry.COUNTERS}))
    snap = telemetry.snapshot(fabric, sys_net=str(tmp_path / "none"), tc=("true",), cluster=SplitCluster(reader))
    assert set(snap["counters"]) == there                     # this machine's ports are not in the test tree
    assert set(snap["times"]) == there and snap["error_s"] == 0.003
    assert all(snap["times"][intf] > snap["time"] for intf in there)
    assert all(snap["counters"][intf]["tx_bytes"] == 1000 for intf in there)
    assert {intf for intf, _c in reader.asked[0]} == there


def test_a_windows_rates_use_each_ports_own_seconds():
    fabric = Fabric(load_spec("tiny"))
    link = fabric.fabric_links[0]
    before = {"time": 10.0, "counters": {link.a_intf: {"tx_bytes": 0}, link.b_intf: {"tx_bytes": 0}}, "drops": {},
              "times": {link.b_intf: 10.5}, "error_s": 0.01}
    after = {"time": 12.0, "counters": {link.a_intf: {"tx_bytes": 250_000}, link.b_intf: {"tx_bytes": 250_000}},
             "drops": {}, "times": {link.b_intf: 11.5}, "error_s": 0.02}
    rows = {r["intf"]: r["mbps"] for r in telemetry.link_utilization(fabric, before, after)}
    assert rows == {link.a_intf: 1.0, link.b_intf: 2.0}          # 2 Mbit over 2 s here, over 1 s there
    assert telemetry.window_error_ms(before, after) == 20.0
    assert telemetry.window_error_ms({"time": 0}, {"time": 1}) == 0.0
