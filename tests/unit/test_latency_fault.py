"""The latency fault (seed 000, 6.4.1) without a network: its scenario entry and steps, the ports
it delays, what it refuses in one line before touching anything, and the netem changes it makes
on a stand-in network."""

import math

import pytest

from fabriclab.errors import LabError
from fabriclab.lab.lab import Lab
from fabriclab.system.shaping import delay_change_command
from fabriclab.topologies.spec import FabricSpec, LinkDelay
from fabriclab.workflows import faultkinds, faults
from fabriclab.workflows.faults import MAX_STEPS, Step, parse, resolve, steps

# 2 leaves, 2 spines, x20000: 0.25 us of real cable is 5 ms in the lab.
SPEC = FabricSpec(name="t-lat", leaves=2, spines=2, hosts_per_leaf=2, host_rate_mbps=20, fabric_rate_mbps=20,
                  real_host_rate_mbps=400_000, delay=LinkDelay(host_us=0.25, fabric_us=0.25))


class Node:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def cmd(self, text):
        self.log.append((self.name, text.replace("; echo __rc=$?", "")))
        return "__rc=0\n"


class Net:
    def __init__(self):
        self.log = []

    def get(self, name):
        return Node(name, self.log)


def netem_lab(spec=SPEC):
    """A Lab of `spec` whose network is a stand-in that records commands, on a kernel with netem."""
    lab = Lab(spec)
    lab.net, lab.delay_mechanism = Net(), "netem"
    return lab


def one(entry):
    return parse([entry])[0]


def test_a_latency_fault_parses_and_expands_to_its_delay_and_its_end():
    lab = netem_lab()
    fault = one({"at": 1, "latency": "s2", "us": 2, "for": 3})
    assert (fault.kind, fault.target, fault.params) == ("latency", "s2", {"us": 2.0, "for": 3.0})
    assert resolve(fault, lab) == []
    out = steps([fault], lab)
    assert [(s.t, s.args, s.undo) for s in out] == [(1.0, ("s2", 2.0), False), (4.0, ("s2", None), True)]
    assert faultkinds.kind("latency").count(fault, [], MAX_STEPS) == 2
    assert [faults.describe(s) for s in out] == ["s2 2 us slower", "s2 latency back to the spec's"]
    (link,) = resolve(one({"at": 0, "latency": "l1-s1", "us": 1}), lab)
    (step,) = steps([one({"at": 0, "latency": "l1-s1", "us": 1})], lab)
    assert step.args == ([link], 1.0) and faults.describe(step) == "l1-s1 1 us slower"


@pytest.mark.parametrize("entry, words", [
    ({"latency": "s1", "us": -1}, "faults[0].us must be in (0, 1e+06], got -1"),
    ({"latency": "s1", "us": math.nan}, "faults[0].us must be a finite number"),
    ({"latency": "s1", "us": 0}, "faults[0].us must be in (0, 1e+06]"),
    ({"latency": "s1"}, "(latency): missing us"),
    ({"latency": ["s1"], "us": 1}, "latency takes a switch or a link A-B"),
])
def test_a_bad_latency_entry_is_one_line(entry, words):
    with pytest.raises(LabError) as err:
        parse([{"at": 1, **entry}])
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("target, words", [
    ("h1", "(latency): no switch 'h1'"), ("s9", "no switch 's9'"), ("l1-s9", "no node 's9'"),
    ("l1-l2", "no link between l1 and l2")])
def test_a_latency_fault_on_what_the_fabric_lacks_is_refused(target, words):
    lab = netem_lab()
    with pytest.raises(LabError) as err:
        resolve(one({"at": 0, "latency": target, "us": 1}), lab)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert lab.net.log == []


def test_without_netem_or_without_a_delay_stage_it_is_refused_building_nothing():
    lab = netem_lab()
    lab.delay_mechanism = "none"
    with pytest.raises(LabError, match="this kernel has no netem"):
        lab.set_latency("s1", 1.0)
    import dataclasses

    bare = netem_lab(dataclasses.replace(SPEC, delay=LinkDelay(host_us=0.25, fabric_us=0.0)))
    with pytest.raises(LabError, match="gives its fabric cables no delay: stage"):
        bare.set_latency("s1", 1.0)
    with pytest.raises(LabError, match="fabric cables no delay"):
        resolve(one({"at": 0, "latency": "l1", "us": 1}), bare)      # a leaf has fabric ports too
    assert lab.net.log == [] and bare.net.log == [] and lab.events == [] and bare.events == []


@pytest.mark.parametrize("us", [-1, math.nan, math.inf, True, "2"])
def test_a_bad_delay_through_the_api_is_refused(us):
    lab = netem_lab()
    with pytest.raises(LabError, match="microseconds >= 0"):
        lab.set_latency("s1", us)
    assert lab.net.log == []


def test_a_switch_fault_delays_each_port_it_sends_from_and_faults_add_up():
    lab = netem_lab()
    ports = lab.set_latency("s1", 0.5)                  # 10 ms more on each of s1's ports
    assert sorted(ports) == sorted(lab.fabric.switch_ports("s1").values())
    assert {(node, text) for node, text in lab.net.log} == {
        ("s1", " ".join(delay_change_command(intf, 15.0))) for intf in ports}
    (link,) = lab.resolve_link("l1", "s1")
    lab.net.log.clear()
    lab.set_latency([link], 0.25)                       # s1's end of it: its cable, s1's fault and this
    assert sorted(lab.net.log) == sorted([("l1", " ".join(delay_change_command(link.a_intf, 10.0))),
                                          ("s1", " ".join(delay_change_command(link.b_intf, 20.0)))])
    assert lab.injected()["latency"] == ["l1-s1 (+0.25 us)", "s1 (+0.5 us)"]
    state = lab.fault_state()
    lab.net.log.clear()
    lab.set_latency("s1", None)                         # the link's fault stays on s1's end
    assert ("s1", " ".join(delay_change_command(link.b_intf, 10.0))) in lab.net.log
    lab.restore(to=state)
    assert lab.fault_state()["latency"].keys() == {"s1", "l1-s1"}
    lab.net.log.clear()
    lab.restore()
    assert lab.fault_state()["latency"] == {}
    assert ("s1", " ".join(delay_change_command(link.b_intf, 5.0))) in lab.net.log
    assert [e["event"] for e in lab.events] == ["latency", "latency", "restore_latency", "latency",
                                                "restore_latency", "restore_latency"]
    assert lab.events[0]["lab_ms"] == 10.0 and lab.events[0]["added_us"] == 0.5


def test_a_delay_past_ten_lab_seconds_is_refused():
    lab = netem_lab()
    with pytest.raises(LabError, match="at most 10000 ms"):
        lab.set_latency("s1", 600.0)                    # 12 s in the lab at x20000
    assert lab.net.log == [] and lab.fault_state()["latency"] == {}


def test_apply_runs_a_latency_step():
    lab = netem_lab()
    faults.apply(lab, Step(0, 0, "latency", ("s2", 1.0)))
    faults.apply(lab, Step(1, 0, "latency", ("s2", None), undo=True))
    assert [e["event"] for e in lab.events] == ["latency", "restore_latency"]


def test_the_change_command_keeps_the_root_netem_and_its_limit():
    cmd = delay_change_command("s1-eth1", 12.5)
    assert cmd[:3] == ["tc", "qdisc", "change"] and cmd[3:9] == ["dev", "s1-eth1", "root", "handle", "5:", "netem"]
    assert cmd[cmd.index("delay") + 1] == "12500us"
