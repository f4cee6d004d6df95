"""Weighted ECMP without a network: the capacity weights (apps/wcmp.py), the weighted groups the
routing asks for, their OpenFlow form, and where flows go on the fake flow table, whose select
groups choose as Open vSwitch's selection methods do (fakeoftable.py).

The fabric is `parallel_links` (4 leaves x 2 spines, 2 links per leaf-spine pair): one of s1's two
links to l1 down leaves s1 half its capacity toward l1, so every other leaf should send a third of
its l1 traffic through s1 and two thirds through s2, where plain ECMP sends half through each.
"""

import collections

import pytest

from fabriclab.apps import openflow
from fabriclab.apps.ecmp import EcmpRouting, WeightedGroup, group_id, group_ports
from fabriclab.apps.ovs_groups import SelectionMethodProperty
from fabriclab.apps.paths import next_hops
from fabriclab.apps.wcmp import RESOLUTION, capacities, integer_weights, member_weights
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec
from tests.unit.fakeoftable import FakeDatapath, dp_hash_table
from tests.unit.test_forwarding import host_ports, programmed


@pytest.fixture(scope="module")
def fab():
    return Fabric(load_spec("parallel_links"))


def down(fab, a, b, member=None):
    return frozenset(link.key for link in fab.find_link(a, b, member))


def uplinks(fab, leaf, spine):
    return sorted(link.a_port if link.a == leaf else link.b_port for link in fab.find_link(leaf, spine))


# -- weights ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["tiny", "parallel_links", "meta_ai_zone", "spectrumx_fig16"])
def test_a_healthy_fabric_weighs_every_member_alike(spec):
    fab = Fabric(load_spec(spec))
    weights, hops = member_weights(fab), next_hops(fab)
    for switch, per_leaf in hops.items():
        for leaf, ports in per_leaf.items():
            if ports:
                assert weights[switch][leaf] == {port: 1 for port in ports}, (switch, leaf)
    assert EcmpRouting(fab, weighted=True).desired() == EcmpRouting(fab).desired()


def test_weights_follow_the_capacity_left_behind_each_member(fab):
    cut = down(fab, "s1", "l1", member=1)
    caps = capacities(fab, cut)
    s1, s2 = uplinks(fab, "l2", "s1"), uplinks(fab, "l2", "s2")
    # s1 has one 10 Mbit/s link left to l1, shared by l2's two cables to s1; s2 has two
    assert {p: caps["l2"]["l1"][p] for p in s1 + s2} == {s1[0]: 5, s1[1]: 5, s2[0]: 10, s2[1]: 10}
    weights = member_weights(fab, cut)
    assert weights["l2"]["l1"] == {s1[0]: 1, s1[1]: 1, s2[0]: 2, s2[1]: 2}
    # toward other leaves nothing changed; s1 itself has one way left to l1
    assert set(weights["l2"]["l3"].values()) == {1}
    assert len(weights["s1"]["l1"]) == 1
    # l1 lost its own cable to s1: its three uplinks left each lead to 10 Mbit/s
    assert set(weights["l1"]["l2"].values()) == {1} and len(weights["l1"]["l2"]) == 3


def test_a_spine_that_lost_every_link_to_a_leaf_is_no_member_at_all(fab):
    cut = down(fab, "s1", "l1")
    weights = member_weights(fab, cut)
    assert weights["l2"]["l1"] == {p: 1 for p in uplinks(fab, "l2", "s2")}


def test_integer_weights_are_the_smallest_that_keep_the_ratios():
    assert integer_weights({1: 10.0, 2: 5.0}) == {1: 2, 2: 1}
    assert integer_weights({1: 10.0, 2: 10.0, 3: 10.0}) == {1: 1, 2: 1, 3: 1}
    assert integer_weights({1: 30.0, 2: 10.0}) == {1: 3, 2: 1}
    assert integer_weights({1: 20.0, 2: 30.0, 3: 30.0}) == {1: 2, 2: 3, 3: 3}
    assert integer_weights({1: 100.0, 2: 0.1}) == {1: RESOLUTION, 2: 1}      # never 0 for a live path
    assert integer_weights({1: 17.0, 2: 1.0})[1] <= RESOLUTION             # OVS's 256 hash values
    assert integer_weights({}) == {}


def test_a_deeper_fabric_counts_capacity_hop_by_hop():
    fab = Fabric(load_spec("meta_ai_zone"))
    leaf = next(iter(fab.leaves()))
    hops = next_hops(fab)
    some_spine = next(s for s in fab.switches.values() if s.role != "leaf" and hops[s.name].get(leaf.name))
    link = fab.find_link(some_spine.name, leaf.name)
    if not link:
        pytest.skip("no direct link from a higher tier to a leaf in this spec")
    weights = member_weights(fab, frozenset({link[0].key}))
    for switch, per_leaf in weights.items():
        for dst, members in per_leaf.items():
            assert set(members) <= set(next_hops(fab, frozenset({link[0].key}))[switch][dst])
            assert all(isinstance(w, int) and w >= 1 for w in members.values())


# -- the routing's groups and their OpenFlow form --------------------------------------------------
def test_weighted_routing_asks_for_a_weighted_group_only_where_capacity_differs(fab):
    cut = down(fab, "s1", "l1", member=1)
    plain, weighted = EcmpRouting(fab).desired(cut), EcmpRouting(fab, weighted=True).desired(cut)
    l1 = group_id(fab.switches["l1"])
    group = weighted["l2"].groups[l1]
    assert isinstance(group, WeightedGroup)
    assert dict(group_ports(group)) == member_weights(fab, cut)["l2"]["l1"]
    assert plain["l2"].groups[l1] == group.ports
    changed = {(s, gid) for s in weighted for gid, g in weighted[s].groups.items() if g != plain[s].groups[gid]}
    assert changed == {(leaf, l1) for leaf in ("l2", "l3", "l4")}


def test_a_weighted_group_is_a_dp_hash_group_with_bucket_weights():
    dp = FakeDatapath(1)
    msg = openflow.group_mod(dp, 7, WeightedGroup((5, 6, 7, 8), (1, 1, 2, 2)))
    (method,) = msg.properties
    assert isinstance(method, SelectionMethodProperty)
    assert (method.method, method.fields, method.param) == ("dp_hash", (), 0)
    assert len(method.serialize()) == 40           # no field list: OVS refuses one with dp_hash
    weights = [[p.weight for p in b.properties if hasattr(p, "weight")][0] for b in msg.buckets]
    assert weights == [1, 1, 2, 2]
    plain = openflow.group_mod(dp, 7, (5, 6))
    assert plain.properties[0].method == "hash" and plain.properties[0].fields


def test_ovs_dp_hash_table_shares_hash_values_by_weight():
    table = dp_hash_table([1, 1, 2, 2])
    assert len(table) == 16
    assert collections.Counter(table) == {0: 3, 1: 3, 2: 5, 3: 5}
    assert collections.Counter(dp_hash_table([1, 1])) == {0: 8, 1: 8}


# -- where flows go -------------------------------------------------------------------------------------
def shares_through_s1(fab, routing, cut, flows=1600):
    """The share of flows from l2's hosts to an l1 host that cross s1, and where they end."""
    core, fake = programmed(fab, routing)
    for link in fab.fabric_links:
        if link.key in cut:
            fake.port_event(core, link, False)
    dst = fab.hosts["h1"].ports[0]
    sources = [p for p in host_ports(fab) if p.leaf == "l2"]
    spines = collections.Counter()
    for i in range(flows):
        src = sources[i % len(sources)]
        (delivery,) = fake.route(src, fake.packet(src, dst.ip, udp_src=10_000 + i))
        assert (delivery.kind, delivery.where) == ("host", dst.intf)
        spines[delivery.switches[1]] += 1
    return spines["s1"] / flows


def test_weighted_ecmp_sends_a_third_of_the_flows_through_the_degraded_spine(fab):
    cut = down(fab, "s1", "l1", member=1)
    # OVS's dp_hash table gives s1's two cables 3 + 3 of 16 hash values: 37.5 %, the nearest its
    # 16 values come to a third
    weighted = shares_through_s1(fab, EcmpRouting(fab, weighted=True), cut)
    assert weighted == pytest.approx(6 / 16, abs=0.05)
    plain = shares_through_s1(fab, EcmpRouting(fab), cut)
    assert plain == pytest.approx(0.5, abs=0.05)


def test_healthy_flows_spread_evenly_on_the_fake_switches(fab):
    assert shares_through_s1(fab, EcmpRouting(fab, weighted=True), frozenset()) == pytest.approx(0.5, abs=0.05)
