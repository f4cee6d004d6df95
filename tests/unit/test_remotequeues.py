"""The queue model across machines, without a network: the start request checked as hostile, the
helper's answers, the lab side's reading of them, pauses relayed between agents, and one merged
reading of every machine's maps."""

import base64
import ctypes
import json
import math
import time

import pytest

from fabriclab.errors import LabError
from fabriclab.cluster import remotequeues
from fabriclab.cluster.remotequeues import RemoteQueues, relay_allowance_ms, start_config
from fabriclab.lab.runstate import LINK_GROUP_BASE
from fabriclab.queues.config import PfcSettings, QueueSpec
from fabriclab.queues.datapath import EV_XOFF, EV_XON, NCLASS, Event, QStat
from fabriclab.queues.model import merge_rows, port_table
from fabriclab.queues.pfc import PfcAgent
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import FabricSpec

SPEC = FabricSpec(name="t-rq", leaves=2, spines=2, hosts_per_leaf=1, queues=QueueSpec())
PLACEMENT = {"l1": "here", "s1": "here", "h1": "here", "l2": "m2", "s2": "m2", "h2": "m2"}


def config(**changes):
    base = {"spec": SPEC.to_dict(), "ecn": "bpf-clsact", "placement": dict(PLACEMENT), "here": "m2",
            "namespaces": {"h2": 4242}, "tunnels": {"l1-eth3": 4097, "s2-eth1": 4097}, "peers": ["10.0.0.1"],
            "wire_handle": LINK_GROUP_BASE + 5, "relay_ms": 4.0}
    return {"start": {**base, **changes}}


# -- the start request ---------------------------------------------------------------------------
def test_a_well_formed_start_request_builds_the_fabric_there():
    got = start_config(json.loads(json.dumps(config())))
    assert sorted(got["fabric"].switches) == ["l1", "l2", "s1", "s2"] and got["fabric"].spec.queues is not None
    assert got["here"] == "m2" and got["relay_ms"] == 4.0


@pytest.mark.parametrize("changes, why", [
    ({"spec": {"name": "x", "bogus": 1}}, "not a fabric spec"),
    ({"spec": {**SPEC.to_dict(), "queues": None}}, "no queues"),
    ({"spec": {**SPEC.to_dict(), "leaves": 0}}, "not a fabric spec"),
    ({"placement": {**PLACEMENT, "h9": "m2"}}, "placement"),
    ({"placement": {k: v for k, v in PLACEMENT.items() if k != "h2"}}, "placement"),
    ({"here": "m3"}, "placement"),
    ({"namespaces": {"h1": 4242}}, "namespaces"),          # h1 is not placed there
    ({"namespaces": {"h2": True}}, "namespaces"),
    ({"namespaces": {"h2": 1 << 30}}, "namespaces"),
    ({"tunnels": {"l1-eth9": 7}}, "tunnels"),
    ({"tunnels": {"l1-eth3": 0}}, "tunnels"),
    ({"tunnels": {"l1-eth3": 1 << 24}}, "tunnels"),
    ({"peers": []}, "peers"),
    ({"peers": ["10.0.0.1; reboot"]}, "peers"),
    ({"relay_ms": math.nan}, "relay_ms"),
    ({"relay_ms": -1}, "relay_ms"),
    ({"relay_ms": 1e9}, "relay_ms"),
    ({"relay_ms": True}, "relay_ms"),
    ({"wire_handle": 7}, "wire_handle"),
    ({"ecn": "magic"}, "ecn"),
])
def test_a_malformed_start_request_is_refused_naming_what(changes, why):
    with pytest.raises(ValueError, match=why):
        start_config(config(**changes))


def test_start_requests_with_unknown_or_missing_keys_are_refused():
    for msg in ({"start": {**config()["start"], "extra": 1}}, {"start": {}}, {"begin": config()["start"]},
                {**config(), "more": 1}, ["start"], "start"):
        with pytest.raises(ValueError, match="expected"):
            start_config(msg)


# -- the helper's answers ------------------------------------------------------------------------
class FakeAgent:
    def __init__(self):
        self.relayed_calls, self.errors, self.storms = [], [], []
        self.alarms = [{"port": "l2-eth1", "t_ns": time.monotonic_ns() - 5 * 10 ** 9}]

    def relayed(self, kind, port, waited_ns):
        if port > 10:
            raise ValueError("no such port here")
        self.relayed_calls.append((kind, port, waited_ns))

    def storm(self, idx, seconds):
        self.storms.append((idx, seconds))

    def note(self, text):
        self.errors.append(text)


class FakeMine:
    """The helper's machine's part of the model (a MachineQueues), recording what it is asked."""

    def __init__(self, agent, calls):
        self.agent, self.calls = agent, calls

    def read_rows(self):
        return (QStat * 3)(), (ctypes.c_int64 * 3)(1, 2, 3)

    def set_ecn(self, target, **kw):
        self.calls.append(("set_ecn", {"target": target, **kw}))
        return ["l2-eth1"]

    def cables_down(self, intfs, down):
        self.calls.append(("cables", intfs, down))

    def empty_queues(self, intfs):
        self.calls.append(("empty", intfs))

    def storm(self, idx, seconds):
        self.agent.storm(idx, seconds)

    def pause(self, kind, idx, waited_ns=0):
        self.agent.relayed(kind, idx, waited_ns)

    def alarms(self):
        return list(self.agent.alarms)


class FakeModel:
    def __init__(self):
        self.agent = FakeAgent()
        self.ports = list(range(8))
        self.calls = []
        self.mine = FakeMine(self.agent, self.calls)


def answer(model, request):
    return remotequeues._answer(model, request if isinstance(request, str) else json.dumps(request))


def test_the_helper_answers_each_request_and_refuses_what_is_malformed():
    model = FakeModel()
    assert set(answer(model, "clock")) == {"wall"}
    stats, bias = answer(model, "rows\n")["rows"]
    assert len(base64.b64decode(stats)) == 3 * ctypes.sizeof(QStat) and len(base64.b64decode(bias)) == 24
    (alarm,) = answer(model, "alarms")["alarms"]           # its time as an age: no clock of that machine's
    assert set(alarm) == {"port", "age_ns"} and 5e9 <= alarm["age_ns"] < 6e9
    assert answer(model, {"set_ecn": {"target": "l2", "mode": "step"}}) == {"done": ["l2-eth1"]}
    assert answer(model, {"storm": [3, 0.5]}) == {"done": 1} and model.agent.storms == [(3, 0.5)]
    assert answer(model, {"cables": [["l2-eth3"], True]}) == {"done": 1}
    assert answer(model, {"empty": ["l2-eth3", "l2-eth4"]}) == {"done": 2}
    assert model.calls == [("set_ecn", {"target": "l2", "mode": "step"}), ("cables", ["l2-eth3"], True),
                           ("empty", ["l2-eth3", "l2-eth4"])]
    for bad in ({"set_ecn": {"target": "l2", "rm": "-rf"}}, {"storm": [99, 1]}, {"storm": [1, math.inf]},
                {"storm": [1, -1]}, {"cables": [["../x"], True]}, {"cables": [["a"], "yes"]},
                {"empty": "l2-eth3"}, {"repairs": "yesterday"}, {"what": 1}, {"a": 1, "b": 2}, [1, 2]):
        assert "error" in answer(model, bad), bad
    assert answer(model, "{nope") == {"error": "not JSON"}


def test_a_relayed_pause_gets_no_answer_and_a_bad_one_is_kept_as_an_error():
    model = FakeModel()
    assert answer(model, {"pfc": [EV_XOFF, 3, 1500]}) is None
    assert model.agent.relayed_calls == [(EV_XOFF, 3, 1_500_000)]            # sent 1.5 ms ago
    assert answer(model, {"pfc": [EV_XON, 99, 0]}) is None                   # not a port of that machine
    for bad in (["XOFF", 3, 0], [1], [EV_XOFF, 3], [EV_XOFF, 3, -1], [EV_XOFF, 3, 10 ** 12]):
        assert answer(model, {"pfc": bad}) is None
    assert len(model.agent.errors) == 6 and len(model.agent.relayed_calls) == 1


# -- the lab's side ------------------------------------------------------------------------------
class FakeChannel:
    def __init__(self, lines):
        self.lines, self.sent = list(lines), []

    def read(self, limit):
        if not self.lines:
            raise LabError("queue model on m2: no answer")
        return self.lines.pop(0)

    def send(self, line):
        self.sent.append(line)

    def close(self):
        pass


class Machine:
    name = "m2"


def remote(lines, nports=2):
    pauses = []
    peer = RemoteQueues(Machine(), "run", nports, lambda kind, idx, waited: pauses.append((kind, idx, waited)))
    peer.round_trip_s = 0.004
    peer.talk.channel = FakeChannel(lines)
    peer.talk.read_all(peer.talk.channel)          # every line the channel has, then its end
    return peer, pauses


def test_pauses_from_another_machine_are_routed_and_answers_queued_in_order():
    rows = (QStat * (2 * NCLASS))()
    rows[4].pause_tx = 7
    bias = (ctypes.c_int64 * (2 * NCLASS))(*range(6))
    reply = {"rows": [base64.b64encode(bytes(rows)).decode(), base64.b64encode(bytes(bias)).decode()]}
    peer, pauses = remote([{"pfc": [EV_XOFF, 1, 300]}, reply, {"pfc": [EV_XON, 1, 0]}, {"pfc": [9, 1, 0]},
                           {"pfc": [EV_XOFF, 2, 0]}, {"pfc": [EV_XOFF, 1]}])
    # its age there plus half the round trip (2 ms)
    assert pauses == [(EV_XOFF, 1, 2_300_000), (EV_XON, 1, 2_000_000)]
    assert len(peer.errors_here) == 3              # a kind it cannot be, a port the fabric has not, no age
    stats, got_bias = peer.read_rows()
    assert stats[4].pause_tx == 7 and list(got_bias) == list(range(6))
    assert peer.channel.sent == ["rows"]
    peer.pause(EV_XOFF, 1, 1_000_000)              # passed on, older by the next hop
    assert json.loads(peer.channel.sent[-1]) == {"pfc": [EV_XOFF, 1, 3000]}
    with pytest.raises(LabError, match="no answer"):
        peer.read_rows()                           # the channel ended: so does every request
    with pytest.raises(LabError, match="no answer"):
        peer.alarms()


def test_alarms_and_repairs_from_another_machine_are_timed_on_this_machines_clock():
    # 3 s old there, plus half the 4 ms round trip: on this machine's monotonic clock, whatever its own says
    peer, _ = remote([{"alarms": [{"port": "l2-eth1", "age_ns": 3 * 10 ** 9}, {"port": "l2-eth2", "age_ns": -1}]},
                      {"repairs": [{"port": "l2-eth3", "bytes": 9, "age_ns": 10 ** 9}]}, {"alarms": [7]}])
    before = time.monotonic_ns()
    first, bad = peer.alarms()
    (repair,) = peer.leak_repairs()
    after = time.monotonic_ns()
    assert before - 3_002_000_000 <= first["t_ns"] <= after - 3_002_000_000 and "age_ns" not in first
    assert bad == {"port": "l2-eth2", "t_ns": None}                       # no sane age, no time
    assert before - 1_002_000_000 <= repair["t_ns"] <= after - 1_002_000_000 and repair["bytes"] == 9
    with pytest.raises(LabError, match="malformed"):
        peer.alarms()


def test_rows_of_another_size_or_not_base64_are_refused():
    for rows in (["AAAA", "AAAA"], ["not base64!", "x"], None):
        peer, _ = remote([{"rows": rows}])
        with pytest.raises(LabError, match="not this fabric's|malformed"):
            peer.read_rows()


def test_an_error_answer_becomes_a_lab_error_naming_the_machine():
    peer, _ = remote([{"error": "no port l9"}])
    with pytest.raises(LabError, match="queue model on m2: no port l9"):
        peer.set_ecn("l9", mode="step")
    assert json.loads(peer.channel.sent[0]) == {"set_ecn": {"target": "l9", "mode": "step"}}


def test_both_twins_implement_one_machines_queues():
    """LocalQueues and RemoteQueues are MachineQueues: every call, with its parameters, on both."""
    import inspect

    from fabriclab.queues.machine import LocalQueues, MachineQueues

    wanted = {name: inspect.signature(f) for name, f in vars(MachineQueues).items()
              if inspect.isfunction(f) and not name.startswith("_")}
    assert len(wanted) >= 14
    for twin in (LocalQueues, RemoteQueues):
        for name, signature in wanted.items():
            assert name in vars(twin), f"{twin.__name__} lacks {name}"
            assert inspect.signature(getattr(twin, name)) == signature, f"{twin.__name__}.{name}"


def test_the_relay_allowance_covers_the_slowest_round_trip_with_a_floor():
    assert relay_allowance_ms([]) == remotequeues.RELAY_FLOOR_MS
    assert relay_allowance_ms([0.0001, 0.0002]) == remotequeues.RELAY_FLOOR_MS
    assert relay_allowance_ms([0.001, 0.003]) == 12.0


# -- one model per machine -----------------------------------------------------------------------
def test_cables_between_machines_get_the_relay_in_their_headroom():
    fabric = Fabric(SPEC)
    ports = port_table(fabric, PLACEMENT, relay_ms=5.0)
    crossing = sorted(p.name for p in ports if p.relay_ms)
    assert crossing == ["l1-eth3", "l2-eth2", "s1-eth2", "s2-eth1"]
    assert all(p.relay_ms == 0 for p in port_table(fabric))


def test_machines_readings_merge_into_one():
    n = 4
    a, b = (QStat * n)(), (QStat * n)()
    a[0].tx_pkts, a[0].occ, a[0].occ_hwm, a[0].paused = 10, 300, 900, 1
    b[0].pause_rx, b[0].occ_hwm = 2, 1200       # the far machine counted the pauses it sent
    b[1].occ = -40
    stats, bias = merge_rows([(a, (ctypes.c_int64 * n)(5, 0, 0, 0)), (b, (ctypes.c_int64 * n)(1, 0, 0, 7))])
    assert (stats[0].tx_pkts, stats[0].occ, stats[0].occ_hwm, stats[0].paused, stats[0].pause_rx) == \
        (10, 300, 1200, 1, 2)
    assert stats[1].occ == -40 and list(bias) == [6, 0, 0, 7]


class Gates:
    def __init__(self):
        self.calls = []

    def set(self, ns_pid, ifindex, rate, burst, limit, what=""):
        self.calls.append((what, rate))


class Port:
    def __init__(self, name):
        self.name, self.ns_pid, self.ifindex = name, None, 1
        self.open_rate_bytes, self.open_burst, self.closed_burst, self.gate_limit = 1000, 1500, 1, 2000


def test_an_agent_relays_pauses_for_other_machines_and_applies_relayed_ones():
    sent, gates, now = [], Gates(), [50_000_000]
    agent = PfcAgent(None, {0: Port("s1-eth2")}, gates, PfcSettings(watchdog_ms=0), clock=lambda: now[0],
                     relay=lambda kind, idx, age: sent.append((kind, idx, age)), rows=6)
    agent._on_event(Event(EV_XOFF, 0, 1, 0, 49_000_000, 0))   # port 1 runs on another machine
    agent._on_event(Event(EV_XOFF, 0, 1, 2, 49_000_000, 0))   # not the lossless class: no pause
    assert sent == [(EV_XOFF, 1, 1_000_000)] and agent.relayed_out == 1 and gates.calls == []
    agent.relayed(EV_XOFF, 0, 3_000_000)
    agent.relayed(EV_XON, 0, 2_000_000)
    assert [rate for _what, rate in gates.calls] == [1, 1000] and agent.relayed_in == 2
    with pytest.raises(ValueError):
        agent.relayed(EV_XOFF, 1)
    stats = agent.reaction_stats()
    assert {k: stats[k] for k in ("pauses", "relayed_out", "relayed_in")} == \
        {"pauses": 0, "relayed_out": 1, "relayed_in": 2}
    assert stats["relayed"]["pauses"] == 1 and stats["relayed"]["p50_ms"] == 3.0


def test_a_relay_that_fails_is_kept_as_an_error():
    def broken(kind, idx, age):
        raise LabError("queue model on m2: closed")
    agent = PfcAgent(None, {0: Port("p")}, Gates(), PfcSettings(watchdog_ms=0), relay=broken)
    agent._on_event(Event(EV_XOFF, 0, 1, 0, 1, 0))
    assert agent.relayed_out == 0 and "closed" in agent.errors[0]


def test_a_buffer_cut_reaches_the_helper_and_a_malformed_one_is_refused():
    model = FakeModel()
    cuts = []
    model.mine.cut_buffer = lambda switch, fraction: cuts.append((switch, fraction)) or [f"{switch}-eth1"]
    assert answer(model, {"cut": ["l2", 0.5]}) == {"done": ["l2-eth1"]} and cuts == [("l2", 0.5)]
    for bad in ({"cut": ["l2"]}, {"cut": [3, 0.5]}, {"cut": ["l2", math.nan]}, {"cut": ["l2", "half"]}):
        assert "error" in answer(model, bad), bad
    assert cuts == [("l2", 0.5)]
    peer, _ = remote([{"done": ["l2-eth1"]}])
    assert peer.cut_buffer("l2", 0.5) == ["l2-eth1"]
    assert json.loads(peer.channel.sent[0]) == {"cut": ["l2", 0.5]}
