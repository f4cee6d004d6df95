"""Link loss without a network: each end of a link is set on the machine it runs on, a failure
on one machine lifts what another already set, and the loss stage on another machine treats its
requests and this machine its replies as hostile."""

import json
import types

import pytest

from fabriclab.errors import LabError
from fabriclab.cluster import remoteloss
from fabriclab.lab import linkloss
from fabriclab.cluster.machine import Machine
from fabriclab.lab.portloss import threshold, valid_port
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec

HERE = Machine("here", "10.0.0.1", local=True)
GUEST = Machine("guest", "10.0.0.2")


class FakeStage:
    def __init__(self, fail=False):
        self.calls, self.fail = [], fail

    def set_ports(self, ports, value):
        self.calls.append((list(ports), value))
        if self.fail and value:
            raise LabError("link loss on guest: tc on l2 failed")


def split_lab(monkeypatch, remote):
    """A tiny fabric with l2 and h2 on the guest; the stages that would set ports, faked."""
    fabric = Fabric(load_spec("tiny"))
    pids = {"h1": 101, "h2": 202}
    lab = types.SimpleNamespace(
        fabric=fabric, run=types.SimpleNamespace(id="20261126-120000-abcdef"),
        net=types.SimpleNamespace(get=lambda name: types.SimpleNamespace(pid=pids[name])),
        cluster=types.SimpleNamespace(machine_of_name=lambda name: GUEST if name in ("l2", "h2") else HERE,
                                      loss_stage=lambda machine: remote))
    here = FakeStage()
    monkeypatch.setattr(linkloss, "PortLoss", lambda run_id: here)
    return lab, here


def link(fabric, a, b):
    return next(k for k in fabric.links if {k.a, k.b} == {a, b})


def test_each_end_of_a_link_is_set_on_the_machine_it_runs_on(monkeypatch):
    remote = FakeStage()
    lab, here = split_lab(monkeypatch, remote)
    crossing, host_link = link(lab.fabric, "l2", "s1"), link(lab.fabric, "h2", "l2")
    local = link(lab.fabric, "h1", "l1")
    linkloss.set_loss(lab, [crossing, host_link, local], 0.25)
    s1_end = ("s1", None, crossing.a_intf if crossing.a == "s1" else crossing.b_intf)
    l2_end = ("l2", None, crossing.a_intf if crossing.a == "l2" else crossing.b_intf)
    h2_end = ("h2", 202, host_link.a_intf if host_link.a == "h2" else host_link.b_intf)
    h1_end = ("h1", 101, local.a_intf if local.a == "h1" else local.b_intf)
    (here_ports, here_value), = here.calls
    (there_ports, there_value), = remote.calls
    assert here_value == there_value == threshold(0.25) == 2**30
    assert s1_end in here_ports and h1_end in here_ports and len(here_ports) == 3      # l1's end too
    assert sorted(there_ports, key=str) == sorted([l2_end, h2_end, ("l2", None, next(
        i for n, i in ((host_link.a, host_link.a_intf), (host_link.b, host_link.b_intf)) if n == "l2"))], key=str)


def test_a_failure_on_one_machine_lifts_what_the_others_had_set(monkeypatch):
    remote = FakeStage(fail=True)
    lab, here = split_lab(monkeypatch, remote)
    with pytest.raises(LabError, match="tc on l2 failed"):
        linkloss.set_loss(lab, [link(lab.fabric, "l1", "s1"), link(lab.fabric, "l2", "s1")], 0.01)
    # here first, then the guest, which fails part way: both are lifted
    assert [value for _ports, value in here.calls] == [value for _p, value in remote.calls] == [threshold(0.01), 0]


def test_a_fraction_outside_0_1_is_refused_before_any_port(monkeypatch):
    lab, here = split_lab(monkeypatch, FakeStage())
    with pytest.raises(LabError, match="fraction in 0..1"):
        linkloss.set_loss(lab, [link(lab.fabric, "l2", "s1")], 1.5)
    assert here.calls == []


@pytest.mark.parametrize("port, ok", [
    (("s1", None, "s1-eth1"), True), (("h2", 4242, "h2-eth0"), True),
    (("h2", 0, "h2-eth0"), False), (("h2", True, "h2-eth0"), False), (("h2", "42", "h2-eth0"), False),
    (("s1", None, "../../etc"), False), (("s1", None, "x" * 16), False), (("s1;rm", None, "eth0"), False),
    (("", None, "eth0"), False), ((7, None, "eth0"), False)])
def test_a_port_is_a_node_a_namespace_pid_and_an_interface_name(port, ok):
    assert valid_port(*port) is ok


class FakePortLoss:
    def __init__(self):
        self.set = []

    def set_ports(self, ports, value):
        if any(intf == "gone" for _n, _p, intf in ports):
            raise LabError("link loss: cannot read the ifindex of gone on s1")
        self.set.append((ports, value))

    def counters(self):
        return {("s1", "s1-eth1"): (3, 97)}


@pytest.mark.parametrize("line", [
    "", "{}", "[]", "nonsense", json.dumps({"set": [["s1", None, "s1-eth1"]]}),
    json.dumps({"set": [["s1", None, "s1-eth1"]], "threshold": 1, "extra": 1}),
    json.dumps({"set": [["s1", None, "s1-eth1"]], "threshold": 2**32}),
    json.dumps({"set": [["s1", None, "s1-eth1"]], "threshold": -1}),
    json.dumps({"set": [["s1", None, "s1-eth1"]], "threshold": 0.5}),
    json.dumps({"set": [], "threshold": 1}),
    json.dumps({"set": [["s1", None, "s1-eth1"]] * (remoteloss.MAX_PORTS + 1), "threshold": 1}),
    json.dumps({"set": [["s1", None, "/etc/x"]], "threshold": 1}),
    json.dumps({"set": [["s1", None]], "threshold": 1})])
def test_the_stage_there_refuses_what_is_not_a_request_and_changes_nothing(line):
    loss = FakePortLoss()
    assert "error" in remoteloss._answer(loss, line + "\n") and loss.set == []


def test_the_stage_there_sets_ports_and_reads_its_counters():
    loss = FakePortLoss()
    request = {"set": [["s1", None, "s1-eth1"], ["h2", 4242, "h2-eth0"]], "threshold": 2**30}
    assert remoteloss._answer(loss, json.dumps(request)) == {"done": 2}
    assert loss.set == [([("s1", None, "s1-eth1"), ("h2", 4242, "h2-eth0")], 2**30)]
    assert remoteloss._answer(loss, "counters\n") == {"counters": [["s1", "s1-eth1", 3, 97]]}
    failed = remoteloss._answer(loss, json.dumps({"set": [["s1", None, "gone"]], "threshold": 1}))
    assert failed == {"error": "link loss: cannot read the ifindex of gone on s1"}


def test_the_stage_there_refuses_a_run_id_that_is_not_one(capsys):
    assert remoteloss.main(["--run-id", "../../etc"]) == 2


class FakeChannel:
    def __init__(self, reply):
        self.reply, self.asked = reply, []

    def ask(self, request, limit=None):
        self.asked.append(request)
        return self.reply


@pytest.mark.parametrize("reply", [
    {}, {"counters": "x"}, {"counters": [["s1", "s1-eth1", 1]]}, {"counters": [["s1", "s1-eth1", -1, 0]]},
    {"counters": [["s1", "s1-eth1", 1, 2**64]]}, {"counters": [["s1", "../x", 1, 1]]},
    {"counters": [["s1", "s1-eth1", True, 1]]}])
def test_this_machine_refuses_a_malformed_counters_reply(reply):
    stage = remoteloss.LossStage(GUEST, "20261126-120000-abcdef")
    stage.channel = FakeChannel(reply)
    with pytest.raises(LabError, match="link loss on guest: a malformed reply"):
        stage.counters()


def test_this_machine_reads_counters_and_reports_a_failure_there_in_one_line():
    stage = remoteloss.LossStage(GUEST, "20261126-120000-abcdef")
    stage.channel = FakeChannel({"counters": [["l2", "l2-eth3", 5, 95]]})
    assert stage.counters() == {("l2", "l2-eth3"): (5, 95)}
    stage.channel = FakeChannel({"error": "link loss: tc on l2 failed: RTNETLINK answers"})
    with pytest.raises(LabError, match=r"^link loss on guest: link loss: tc on l2 failed"):
        stage.set_ports([("l2", None, "l2-eth3")], 1)
    stage.channel = FakeChannel({"done": 0})
    with pytest.raises(LabError, match="a malformed reply"):
        stage.set_ports([("l2", None, "l2-eth3")], 1)
    assert stage.channel.asked == [{"set": [["l2", None, "l2-eth3"]], "threshold": 1}]


def test_counters_come_from_the_stages_the_run_started():
    asked = []
    stage = types.SimpleNamespace(counters=lambda: asked.append(1) or {("l2", "l2-eth3"): (1, 9)})
    cluster = types.SimpleNamespace(machines=[HERE, GUEST], helpers={("guest", remoteloss.MODULE): stage})
    assert remoteloss.counters(cluster) == {("l2", "l2-eth3"): (1, 9)} and asked == [1]
    assert remoteloss.counters(types.SimpleNamespace(machines=[HERE, GUEST], helpers={})) == {}


def test_load_readies_each_machines_programs_and_sets_no_port(monkeypatch):
    remote = FakeStage()
    lab, here = split_lab(monkeypatch, remote)
    loaded = []
    here.load_ports = lambda ports: loaded.append(("here", list(ports)))
    remote.load_ports = lambda ports: loaded.append(("guest", list(ports)))
    linkloss.load(lab, [link(lab.fabric, "l2", "s1")])
    assert sorted((where, [p[0] for p in ports]) for where, ports in loaded) == [("guest", ["l2"]), ("here", ["s1"])]
    assert here.calls == remote.calls == []


def test_the_stage_there_loads_programs_on_request():
    loaded = []
    loss = types.SimpleNamespace(load_ports=loaded.append, set_ports=None)
    assert remoteloss._answer(loss, json.dumps({"load": [["h2", 4242, "h2-eth0"]]})) == {"done": 1}
    assert loaded == [[("h2", 4242, "h2-eth0")]]
    assert "error" in remoteloss._answer(loss, json.dumps({"load": [["h2", 4242, "h2-eth0"]], "threshold": 1}))
    assert "error" in remoteloss._answer(loss, json.dumps({"load": [["h2", -1, "h2-eth0"]]}))


def test_a_timeline_with_loss_readies_its_links_before_its_clock_starts():
    from fabriclab.workflows import faults

    fabric = Fabric(load_spec("tiny"))
    readied = []
    lab = types.SimpleNamespace(fabric=fabric, prepare_loss=readied.append,
                                resolve_link=lambda a, b, member=None: [link(fabric, a, b)])
    steps = faults.steps(faults.parse([{"at": 1.0, "loss": "l2-s1", "fraction": 0.1, "for": 1.0},
                                       {"at": 2.0, "link_down": "l1-s1"}]), lab)
    faults.prepare(lab, steps)
    assert [sorted(k.label for k in links) for links in readied] == [[link(fabric, "l2", "s1").label]]
    readied.clear()
    faults.prepare(lab, faults.steps(faults.parse([{"at": 2.0, "link_down": "l1-s1"}]), lab))
    assert readied == []


class FakeLossMap:
    """The loss program's map: entries by ifindex, counted by `send` as the program would."""

    def __init__(self):
        self.entries = {}

    def update(self, key, value):
        self.entries[key] = value

    def lookup(self, key):
        return self.entries.get(key)

    def delete(self, key):
        del self.entries[key]

    def send(self, key, dropped, passed):
        entry = self.entries.get(key)
        if entry is not None:
            entry.dropped += dropped if entry.threshold else 0
            entry.passed += passed + (0 if entry.threshold else dropped)


def fake_port_loss(monkeypatch):
    """A PortLoss on a fake map whose one port is ifindex 7: (the PortLoss, its stage)."""
    from fabriclab.lab import portloss

    loss = portloss.PortLoss("r")
    stage = types.SimpleNamespace(map=FakeLossMap(), attached={}, pin="/sys/fs/bpf/x")
    loss.stages["switches"] = stage
    monkeypatch.setattr(portloss.PortLoss, "_stage", lambda self, node, pid, intf: stage)
    monkeypatch.setattr(portloss, "_ifindex", lambda node, pid, intf: 7)
    monkeypatch.setattr(portloss, "_tc", lambda node, pid, commands: None)
    return loss, stage


def test_a_ports_loss_count_survives_a_new_rate_and_its_lifting(monkeypatch):
    # A timed fault changes and lifts the loss mid-run: what the port dropped must still be counted
    loss, stage = fake_port_loss(monkeypatch)
    loss.set("l1", None, "l1-eth3", threshold(0.5))
    stage.map.send(7, dropped=10, passed=20)
    loss.set("l1", None, "l1-eth3", threshold(0.1))                 # a new rate: the count goes on
    stage.map.send(7, dropped=2, passed=30)
    assert loss.counters() == {("l1", "l1-eth3"): (12, 50)}
    loss.set("l1", None, "l1-eth3", 0)                              # lifted: nothing more dropped,
    stage.map.send(7, dropped=5, passed=5)
    assert loss.counters() == {("l1", "l1-eth3"): (12, 50)}         # and nothing forgotten
    loss.set("l1", None, "l1-eth3", threshold(0.5))
    stage.map.send(7, dropped=1, passed=1)
    assert loss.counters() == {("l1", "l1-eth3"): (13, 51)}


def test_a_port_that_carried_nothing_stays_listed_after_its_loss_is_lifted(monkeypatch):
    # A lossy cable the traffic's hash did not use: lifted, it must still read (0, 0), not vanish
    # (a run reads a difference per port, before and after)
    loss, stage = fake_port_loss(monkeypatch)
    loss.set("s1", None, "s1-eth2", threshold(0.3))
    assert loss.counters() == {("s1", "s1-eth2"): (0, 0)}
    loss.set("s1", None, "s1-eth2", 0)
    assert loss.counters() == {("s1", "s1-eth2"): (0, 0)}
