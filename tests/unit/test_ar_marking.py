"""The queue model's "ar" ECN mode (seed 002 4.2: switches mark only when adaptive routing's
capacity is exhausted): the marking rule, the groups it marks by (from the routes, less the
cables that are down), the thresholds the data path gets, and how the model writes the groups."""

import ctypes

import pytest

from fabriclab.apps.paths import ar_groups, next_hops
from fabriclab.errors import LabError
from fabriclab.queues import config
from fabriclab.queues.config import EcnProfile, QueueSpec, ar_mark, mark_probability, queues_from_dict
from fabriclab.queues.datapath import AR_MAX_MEMBERS
from fabriclab.queues.model import QueueModel
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec


def test_ar_marks_only_when_every_eligible_member_is_at_or_above_kmin():
    assert ar_mark(10_000, 10_000, [(10_000, 10_000), (50_000, 10_000)])      # all deep: mark
    assert not ar_mark(10_000, 10_000, [(10_000, 10_000), (9_999, 10_000)])  # one has room
    assert not ar_mark(9_999, 10_000, [(90_000, 10_000)])                     # its own queue is short
    assert ar_mark(20_000, 10_000, [])                                        # the only way there
    assert not ar_mark(0, 1, [])
    # each member against its own threshold
    assert ar_mark(5_000, 5_000, [(20_000, 20_000), (7_000, 6_000)])
    assert not ar_mark(5_000, 5_000, [(19_999, 20_000)])


def test_one_deep_queue_marks_under_step_but_not_under_ar():
    """A single deep uplink beside idle ones: DCQCN's switches mark it, SPX's do not."""
    deep, idle = 40_000, [(0, 10_000)] * 3
    assert mark_probability(deep, 10_000, 10_000, 1.0, "step") == 1.0
    assert not ar_mark(deep, 10_000, idle)


def test_ar_mode_parses_and_gives_the_data_path_a_step_at_kmin():
    spec = queues_from_dict({"ecn": {"mode": "ar", "kmin": "20KiB", "kmax": "60KiB"}})
    assert spec.ecn_for("leaf") == EcnProfile("ar", 20_480, 61_440, 0.2)
    assert config.ecn_thresholds(100_000, spec.ecn_for("leaf")) == (20_480, 20_480)
    t = config.thresholds(spec, "leaf", config.LOSSLESS, 100_000, 100.0, 1500)
    assert t.ecn_mode == config.ECN_AR == 4 and t.kmin == t.kmax == 20_480
    assert config.thresholds(spec, "leaf", config.CONTROL, 100_000, 100.0, 1500).ecn_mode == 0
    assert config.ECN_QDISC not in config.ECN_MODE_IDS.values()
    assert QueueSpec.from_dict(spec.to_dict()) == spec


def _fabric(name):
    return Fabric(load_spec(name))


def test_groups_are_the_shortest_path_next_hops_of_each_destination_leaf():
    fabric = _fabric("spectrumx_fig16")
    groups = ar_groups(fabric)
    hops = next_hops(fabric)
    leaf = next(s for s in fabric.switches.values() if s.role == "leaf")
    other = next(s for s in fabric.leaves(leaf.plane) if s.name != leaf.name)
    names = fabric.switch_ports(leaf.name)
    uplinks = sorted(names[p] for p in hops[leaf.name][other.name])
    # towards every remote leaf of its plane, the leaf's group is its uplinks
    assert all(groups[(leaf.name, net)] == uplinks for (switch, net) in groups if switch == leaf.name)
    host_port = next(p for h in fabric.hosts.values() for p in h.ports if p.leaf == other.name)
    a, b, c, _d = (int(x) for x in host_port.ip.split("."))
    assert groups[(leaf.name, (a << 24) | (b << 16) | (c << 8))] == uplinks
    assert len(uplinks) >= 2
    # a leaf's own hosts are reached by one port each: no group
    mine = next(p for h in fabric.hosts.values() for p in h.ports if p.leaf == leaf.name)
    a, b, c, _d = (int(x) for x in mine.ip.split("."))
    assert (leaf.name, (a << 24) | (b << 16) | (c << 8)) not in groups
    # every group is one switch's ports, and none is larger than the data path compares
    for (switch, _net), members in groups.items():
        assert set(members) <= set(fabric.switch_ports(switch).values())
        assert 2 <= len(members) <= AR_MAX_MEMBERS


def test_a_cable_that_is_down_leaves_its_groups():
    fabric = _fabric("spectrumx_fig16")
    groups = ar_groups(fabric)
    (switch, net), members = next(iter(sorted(groups.items())))
    gone = members[0]
    after = ar_groups(fabric, {gone})
    assert gone not in {m for ms in after.values() for m in ms}
    left = [m for m in members if m != gone]
    if len(left) >= 2:
        assert after[(switch, net)] == left
    else:
        assert (switch, net) not in after              # one way left: no group, own queue only


class FakeMap:
    def __init__(self):
        self.rows = {}

    def keys(self):
        return [k for k in self.rows.values()]

    def delete(self, key):
        self.rows.pop((key.node, key.net))

    def update(self, key, value):
        copy = type(value)()
        ctypes.memmove(ctypes.byref(copy), ctypes.byref(value), ctypes.sizeof(value))
        self.rows[(key.node, key.net)] = key
        self.values = getattr(self, "values", {})
        self.values[(key.node, key.net)] = (copy.n, list(copy.idx)[:copy.n])


def _model(name="spectrumx_fig16"):
    fabric = _fabric(name)
    model = QueueModel(fabric, None, "unit")
    model.datapath = type("DP", (), {"ar_groups": FakeMap()})()
    return fabric, model


def test_the_model_writes_groups_by_node_and_port_index_and_removes_stale_ones():
    fabric, model = _model()
    groups = ar_groups(fabric)
    assert model.set_ar_groups(groups) == len(groups)
    table = model.datapath.ar_groups
    (switch, net), members = next(iter(sorted(groups.items())))
    n, idxs = table.values[(model.node_ids[switch], net)]
    assert n == len(members) and [model.ports[i].name for i in idxs] == members
    gone = members[0]
    model.set_ar_groups(ar_groups(fabric, {gone}))
    assert all(model.ports[i].name != gone for key in table.rows for i in table.values[key][1])
    assert len(table.rows) == len(ar_groups(fabric, {gone}))


@pytest.mark.parametrize("groups, message", [
    ({("nope", 1): ["x"]}, "no switch 'nope'"),
    ({("h1", 1): ["x"]}, "no switch 'h1'"),
])
def test_bad_groups_are_refused(groups, message):
    _fabric_, model = _model()
    with pytest.raises(LabError, match=message):
        model.set_ar_groups(groups)


def test_a_member_of_another_switch_is_refused():
    fabric, model = _model()
    groups = ar_groups(fabric)
    (switch, net), members = next(iter(sorted(groups.items())))
    stranger = next(p.name for p in model.ports if p.node != switch)
    with pytest.raises(LabError, match=f"ar group of {switch}"):
        model.set_ar_groups({(switch, net): members[:1] + [stranger]})
    with pytest.raises(LabError, match=f"{AR_MAX_MEMBERS + 1} members"):
        model.set_ar_groups({(switch, net): members[:1] * (AR_MAX_MEMBERS + 1)})


def test_a_red_qdisc_on_an_ar_port_marks_nothing():
    """Where the kernel's RED marks, an ar port's RED is put out of reach: the program marks."""
    from fabriclab.queues.red import red_params

    assert red_params(EcnProfile("ar", kmin=20_000), 100_000, 100_000) == \
        red_params(EcnProfile("off"), 100_000, 100_000)
