"""The buffer fault (seed 000, 6.4.2) without a network: its scenario entry, its steps, the Lab's
checks and log, the queue model's limits per port, and the data path's rule."""

import math
import pathlib

import pytest

from fabriclab.errors import LabError
from fabriclab.lab.lab import Lab
from fabriclab.queues import config
from fabriclab.queues.datapath import NCLASS
from fabriclab.queues.model import QueueModel
from fabriclab.topologies.spec import load_spec
from fabriclab.workflows import faultkinds, faults
from fabriclab.workflows.faults import MAX_STEPS, Step, parse, resolve, steps


@pytest.fixture(scope="module")
def lab():
    """The incast fabric (it has the queue model) as a Lab object; never started."""
    return Lab(load_spec("incast"))


def one(entry):
    return parse([entry])[0]


def test_a_buffer_fault_parses_and_expands_to_a_cut_and_its_end(lab):
    fault = one({"at": 1, "buffer": "s1", "fraction": 0.5, "for": 2})
    assert (fault.kind, fault.target, fault.params) == ("buffer", "s1", {"fraction": 0.5, "for": 2.0})
    assert resolve(fault, lab) == []
    out = steps([fault], lab)
    assert [(s.t, s.action, s.args, s.undo) for s in out] == [(1.0, "buffer", ("s1", 0.5), False),
                                                              (3.0, "buffer", ("s1", None), True)]
    kind = faultkinds.kind("buffer")
    assert kind.count(fault, [], MAX_STEPS) == len(out)
    assert [faults.describe(s) for s in out] == ["switch s1 buffer cut to 0.5", "switch s1 buffer whole again"]


@pytest.mark.parametrize("entry, words", [
    ({"buffer": "s1", "fraction": 0}, "fraction must be in (0, 1]"),
    ({"buffer": "s1", "fraction": 1.5}, "fraction must be in (0, 1]"),
    ({"buffer": "s1", "fraction": math.nan}, "fraction"),
    ({"buffer": "s1"}, "(buffer): missing fraction"),
    ({"buffer": "s1", "fraction": 0.5, "rate_mbps": 3}, "unknown field 'rate_mbps'"),
    ({"buffer": 7, "fraction": 0.5}, "buffer takes a switch"),
])
def test_a_bad_buffer_fault_is_one_line(entry, words):
    with pytest.raises(LabError) as err:
        parse([{"at": 1, **entry}])
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_buffer_fault_needs_a_switch_and_the_queue_model(lab):
    with pytest.raises(LabError, match=r"faults\[0\] \(buffer\): no switch 'h1'"):
        resolve(one({"at": 0, "buffer": "h1", "fraction": 0.5}), lab)
    with pytest.raises(LabError, match="has no queues: section"):
        resolve(one({"at": 0, "buffer": "s1", "fraction": 0.5}), Lab(load_spec("default")))


@pytest.mark.parametrize("fraction", [0, -0.5, 1.01, math.nan, math.inf, True, "half", None])
def test_a_cut_keeps_a_fraction_in_zero_one(fraction):
    with pytest.raises(LabError, match=r"in \(0, 1\]"):
        config.check_cut(fraction)
    assert config.check_cut(1) == 1.0 and config.check_cut(0.25) == 0.25


def test_a_cut_limit_is_that_share_of_the_port_buffer_and_none_when_whole():
    assert config.cut_limit(96 * 1024, 0.5) == 48 * 1024
    assert config.cut_limit(96 * 1024, 1.0) == 0             # 0: the data path's "no cut"
    assert config.cut_limit(100, 1e-9) == 1                  # never 0 (that would mean no cut)


class FakeMap:
    def __init__(self):
        self.rows = {}

    def update(self, key, value):
        self.rows[key] = value.value


class FakeQueues:
    def __init__(self):
        self.calls = []

    def cut_buffer(self, switch, fraction):
        self.calls.append((switch, fraction))
        return [f"{switch}-eth1"]


def test_the_lab_cuts_through_its_queue_model_logs_it_and_restore_ends_it():
    lab = Lab(load_spec("incast"))
    with pytest.raises(LabError, match="no switch 'h1'"):
        lab.cut_buffer("h1", 0.5)
    with pytest.raises(LabError, match="no queues: section|queue model"):
        lab.cut_buffer("s1", 0.5)                       # not started: no model
    lab.queues = FakeQueues()
    for bad in (0, 1.5, math.nan):
        with pytest.raises(LabError, match=r"\(0, 1\]"):
            lab.cut_buffer("s1", bad)
    assert lab.queues.calls == []                       # nothing reached the model
    assert lab.cut_buffer("s1", 0.5) == ["s1-eth1"]
    state = lab.fault_state()
    assert state["cut"] == {"s1": 0.5} and lab.injected()["buffer_cuts"] == ["s1 (0.5)"]
    lab.cut_buffer("s2", 0.25)
    lab.restore(to=state)                               # back to the state taken: s1 cut, s2 whole
    assert lab.queues.calls[-1] == ("s2", 1.0) and lab.fault_state()["cut"] == {"s1": 0.5}
    lab.restore()
    assert lab.queues.calls[-1] == ("s1", 1.0) and lab.injected()["buffer_cuts"] == []
    assert [(e["event"], e["target"], e.get("fraction")) for e in lab.events] == [
        ("buffer_cut", "s1", 0.5), ("buffer_cut", "s2", 0.25), ("restore_buffer", "s2", None),
        ("restore_buffer", "s1", None)]


def test_apply_runs_a_buffer_step_on_the_lab():
    lab = Lab(load_spec("incast"))
    lab.queues = FakeQueues()
    faults.apply(lab, Step(0, 0, "buffer", ("l1", 0.5)))
    faults.apply(lab, Step(1, 0, "buffer", ("l1", None), undo=True))
    assert lab.queues.calls == [("l1", 0.5), ("l1", 1.0)]


def test_the_model_writes_each_port_and_class_limit_of_the_switch_only():
    spec = load_spec("incast")
    from fabriclab.topologies.fabric import Fabric

    model = QueueModel(Fabric(spec), None, "t")
    model.datapath = type("DP", (), {"cut": FakeMap()})()
    names = model.cut_buffer("s2", 0.5)
    ports = [p for p in model.ports if p.node == "s2"]
    assert sorted(names) == sorted(p.name for p in ports) and len(ports) == 5
    assert model.datapath.cut.rows == {p.idx * NCLASS + c: p.buffer // 2 for p in ports for c in range(NCLASS)}
    assert all(p.buffer == 1536 * 1024 for p in ports) and model.cuts == {"s2": 0.5}
    model.cut_buffer("s2", 1)
    assert set(model.datapath.cut.rows.values()) == {0} and model.cuts == {}
    with pytest.raises(LabError, match="no switch 'h3'"):
        model.cut_buffer("h3", 0.5)


def test_the_data_path_drops_at_the_cut_before_the_pfc_rule_in_a_function_of_its_own():
    source = (pathlib.Path(config.__file__).with_name("fabricq.bpf.c")).read_text()
    rule = source[source.index("static __always_inline int cut_drop"):]
    rule = rule[:rule.index("\n}\n")]
    assert "occ + len <= *limit" in rule and "st->drops" in rule
    egress = source[source.index("int fq_egress"):]
    assert egress.index("cut_drop(row, st, occ, len)") < egress.index("if (cf->pfc)")


def test_lossless_drops_at_a_cut_are_named_as_such_and_do_not_invalidate_the_run():
    from fabriclab.workflows import pipeline

    report = {"report": {"ports": [
        {"port": "s1-eth2", "node": "s1", "class": "lossless", "drops": 12, "lossless_drops": 0},
        {"port": "s1-eth3", "node": "s1", "class": "lossy", "drops": 4},
        {"port": "l1-eth1", "node": "l1", "class": "lossless", "lossless_drops": 2}]}}
    assert pipeline.cut_drops(report) == ["lossless drop: s1-eth2 (s1) dropped 12 at a buffer cut"]
    assert pipeline.lossless_drops(report) == ["lossless drop: l1-eth1 (l1) dropped 2 over its headroom"]
