"""ECMP routing as data: the desired flows and groups per switch, and the diff that installs them.

The diffs are translated to OpenFlow (apps/openflow.py) and applied to the fake switch of
fakeoftable.py, which refuses any message OpenFlow would refuse or that would leave a flow pointing
at a missing group, so ordering mistakes show up without a switch; where packets then go is
test_forwarding.py's subject.
"""

import ipaddress

import pytest

from fabriclab.apps import openflow
from fabriclab.apps.ecmp import (
    PRIO_ARP,
    PRIO_HOST,
    PRIO_PREFIX,
    EcmpRouting,
    Flow,
    SwitchState,
    diff,
    group_id,
    match,
)
from fabriclab.apps.paths import next_hops
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import FabricSpec, load_spec
from tests.unit.fakeoftable import FakeDatapath, FakeOFTable

ARP = Flow(PRIO_ARP, match(eth_type=0x0806), ("controller",))


def fabric(**fields):
    return Fabric(FabricSpec(name="t", **fields))


def down(fab, node1, node2, member=None):
    return frozenset(link.key for link in fab.find_link(node1, node2, member))


def prefix_flow(leaf):
    net = f"10.{leaf.plane}.{leaf.index}.0"
    return Flow(PRIO_PREFIX, match(eth_type=0x0800, ipv4_dst=(net, "255.255.255.0")), ("group", group_id(leaf)))


class FakeSwitch:
    """A fake OpenFlow table that takes diff() ops through the OpenFlow translation."""

    def __init__(self):
        self.dp = FakeDatapath(1)
        self.table = FakeOFTable()

    def apply(self, ops):
        for op in ops:
            self.table.apply(openflow.messages(self.dp, op))

    def snapshot(self):
        return self.table.snapshot()


def programmed(state):
    """The snapshot of a switch programmed with `state` from nothing."""
    switch = FakeSwitch()
    switch.apply(diff(None, state))
    return switch.snapshot()


# -- desired state -----------------------------------------------------------------------------------

@pytest.fixture(params=["tiny", "meta_ai_zone", "parallel_links", "spectrumx_fig16"])
def fab(request):
    return Fabric(load_spec(request.param))


def test_arp_goes_to_the_controller_only_at_leaves(fab):
    states = EcmpRouting(fab).desired()
    for switch in fab.switches.values():
        assert (ARP in states[switch.name].flows) == (switch.role == "leaf")
        controller = [f for f in states[switch.name].flows if f.action == ("controller",)]
        assert controller == ([ARP] if switch.role == "leaf" else [])


def test_one_host_route_per_host_port_at_its_leaf(fab):
    states = EcmpRouting(fab).desired()
    for switch in fab.switches.values():
        routes = {(f.match_dict["ipv4_dst"], f.action) for f in states[switch.name].flows
                  if f.priority == PRIO_HOST}
        expected = {(p.ip, ("output", p.leaf_port)) for host in fab.hosts.values() for p in host.ports
                    if p.leaf == switch.name}
        assert routes == expected
        if switch.role == "leaf":
            assert len(routes) == fab.spec.hosts_per_leaf * fab.spec.nics_per_host
    for flow in (f for state in states.values() for f in state.flows if f.priority == PRIO_HOST):
        assert flow.match_dict["eth_type"] == 0x0800
        assert isinstance(flow.match_dict["ipv4_dst"], str), "a host route matches the whole address"


def test_one_prefix_flow_and_select_group_per_remote_leaf(fab):
    states = EcmpRouting(fab).desired()
    hops = next_hops(fab)
    for switch in fab.switches.values():
        state = states[switch.name]
        remote = [leaf for leaf in fab.leaves(switch.plane) if leaf.name != switch.name]
        prefixes = {f for f in state.flows if f.priority == PRIO_PREFIX}
        assert prefixes == {prefix_flow(leaf) for leaf in remote}
        assert set(state.groups) == {group_id(leaf) for leaf in remote}
        for leaf in remote:
            assert state.groups[group_id(leaf)] == tuple(hops[switch.name][leaf.name])
        extra = 1 + fab.spec.hosts_per_leaf * fab.spec.nics_per_host if switch.role == "leaf" else 0
        assert len(state.flows) == len(remote) + extra


def test_prefix_flows_cover_exactly_the_leaf_subnets(fab):
    states = EcmpRouting(fab).desired()
    for switch in fab.switches.values():
        for flow in states[switch.name].flows:
            if flow.priority != PRIO_PREFIX:
                continue
            net, mask = flow.match_dict["ipv4_dst"]
            subnet = ipaddress.ip_network(f"{net}/{mask}")
            assert subnet.prefixlen == 24
            gid = flow.action[1]
            owners = {p.leaf for h in fab.hosts.values() for p in h.ports if ipaddress.ip_address(p.ip) in subnet}
            assert len(owners) == 1
            owner = fab.switches[owners.pop()]
            assert gid == group_id(owner) and owner.plane == switch.plane


def test_group_ids_are_unique_across_planes():
    fab = Fabric(load_spec("spectrumx_fig16"))
    ids = [group_id(leaf) for leaf in fab.leaves()]
    assert len(set(ids)) == len(ids) == 12
    assert group_id(fab.switches["p3l2"]) == (3 << 16) | 2


def test_multiplane_switches_hold_only_their_planes_routes():
    fab = Fabric(load_spec("spectrumx_fig16"))
    for name, state in EcmpRouting(fab).desired().items():
        plane = fab.switches[name].plane
        for flow in state.flows:
            dst = flow.match_dict.get("ipv4_dst")
            if dst is not None:
                address = dst if isinstance(dst, str) else dst[0]
                assert address.startswith(f"10.{plane}."), (name, flow)
        assert {gid >> 16 for gid in state.groups} == {plane}


def test_failures_change_groups_not_flows():
    fab = fabric(leaves=3, spines=2, hosts_per_leaf=2)
    routing = EcmpRouting(fab)
    before = routing.desired()
    after = routing.desired(down(fab, "l1", "s1"))
    for name in fab.switches:
        assert after[name].flows == before[name].flows
    assert after["l1"].groups[group_id(fab.switches["l2"])] == (4,)
    assert after["l2"].groups[group_id(fab.switches["l1"])] == (4,)
    assert after["l2"].groups[group_id(fab.switches["l3"])] == (3, 4)


def test_an_isolated_leaf_gets_empty_groups_everywhere():
    fab = fabric(leaves=3, spines=2, hosts_per_leaf=1)
    states = EcmpRouting(fab).desired(down(fab, "l3", "s1") | down(fab, "l3", "s2"))
    gid = group_id(fab.switches["l3"])
    for name in ("l1", "l2", "s1", "s2"):
        assert states[name].groups[gid] == ()
        assert prefix_flow(fab.switches["l3"]) in states[name].flows
    assert set(states["l3"].groups.values()) == {()}


# -- diff ----------------------------------------------------------------------------------------------------

def test_from_nothing_the_switch_is_reset_then_groups_come_before_flows():
    fab = Fabric(load_spec("default"))
    state = EcmpRouting(fab).desired()["l1"]
    ops = diff(None, state)
    assert ops[0] == ("reset",)
    kinds = [op[0] for op in ops[1:]]
    assert set(kinds) == {"group_add", "flow_add"}
    assert kinds.index("flow_add") == kinds.count("group_add")
    assert kinds.count("group_add") == len(state.groups) == 3
    assert kinds.count("flow_add") == len(state.flows)
    switch = FakeSwitch()
    switch.apply(ops)
    flows, groups = switch.snapshot()
    assert len(flows) == len(state.flows) and set(groups) == set(state.groups)


def test_an_empty_switch_still_starts_with_a_reset():
    assert diff(None, SwitchState()) == [("reset",)]


def test_groups_are_deleted_after_the_flows_that_use_them():
    old = SwitchState({Flow(PRIO_PREFIX, match(eth_type=0x0800, ipv4_dst="10.1.1.1"), ("group", 5)), ARP},
                      {5: (1, 2)})
    new = SwitchState({Flow(PRIO_PREFIX, match(eth_type=0x0800, ipv4_dst="10.1.1.2"), ("group", 6)), ARP},
                      {6: (3,)})
    ops = diff(old, new)
    assert [op[0] for op in ops] == ["group_add", "flow_del", "flow_add", "group_del"]
    switch = FakeSwitch()
    switch.apply(diff(None, old))
    switch.apply(ops)
    assert switch.snapshot() == programmed(new)
    with pytest.raises(AssertionError, match="deleted while flows use it"):
        switch.apply([("group_del", 6)])                     # the fake refuses the unsafe order


def test_a_single_link_failure_is_only_group_mods():
    fab = Fabric(load_spec("default"))
    routing = EcmpRouting(fab)
    before = routing.desired()
    after = routing.desired(down(fab, "l1", "s2"))
    ops = {name: diff(before[name], after[name]) for name in fab.switches}
    assert {op[0] for switch_ops in ops.values() for op in switch_ops} == {"group_mod"}
    changed = {name for name, switch_ops in ops.items() if switch_ops}
    assert changed == {"l1", "l2", "l3", "l4", "s2"}
    assert len(ops["l1"]) == 3, "the failed leaf changes its group for each remote leaf"
    l1 = group_id(fab.switches["l1"])
    for other in ("l2", "l3", "l4"):
        assert ops[other] == [("group_mod", l1, (3, 5, 6))], "the others drop s2 toward l1"
    for name, switch_ops in ops.items():
        for _kind, gid, ports in switch_ops:
            assert after[name].groups[gid] == ports


def test_recovery_restores_the_groups():
    fab = Fabric(load_spec("parallel_links"))
    routing = EcmpRouting(fab)
    healthy = routing.desired()
    failed = routing.desired(down(fab, "l2", "s1", member=1))
    for name in fab.switches:
        switch = FakeSwitch()
        switch.apply(diff(None, healthy[name]))
        switch.apply(diff(healthy[name], failed[name]))
        assert switch.snapshot() == programmed(failed[name])
        switch.apply(diff(failed[name], healthy[name]))
        assert switch.snapshot() == programmed(healthy[name])


def test_no_ops_when_nothing_changed(fab):
    routing = EcmpRouting(fab)
    first, second = routing.desired(), routing.desired()
    for name in fab.switches:
        assert first[name] is not second[name]
        assert diff(first[name], second[name]) == []


def test_diff_sequence_over_failures_keeps_the_fake_switch_consistent():
    fab = Fabric(load_spec("spectrumx_fig16"))
    routing = EcmpRouting(fab)
    cut = down(fab, "p2l2", "p2s1") | down(fab, "p2l2", "p2s2")
    steps = [frozenset(), down(fab, "p2l2", "p2s1", member=0), cut, down(fab, "p3l3", "p3s2"), frozenset()]
    switches = {name: FakeSwitch() for name in fab.switches}
    installed = {}
    for failed in steps:
        desired = routing.desired(failed)
        for name, switch in switches.items():
            switch.apply(diff(installed.get(name), desired[name]))
            assert switch.snapshot() == programmed(desired[name])
        installed = desired


def test_diff_is_deterministic():
    fab = Fabric(load_spec("meta_ai_zone"))
    state = EcmpRouting(fab).desired()["l2"]
    assert diff(None, state) == diff(None, EcmpRouting(fab).desired()["l2"])
    group_ops = [op for op in diff(None, state) if op[0] == "group_add"]
    assert [op[1] for op in group_ops] == sorted(op[1] for op in group_ops)
