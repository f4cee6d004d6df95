"""The fake OpenFlow table itself: the forwarding semantics the routing tests rely on."""

import pytest

from fabriclab.apps import openflow
from fabriclab.apps.ecmp import FailoverGroup, Flow, match
from fabriclab.apps.steering import IN_PORT, ReplicateGroup, Rewrite
from tests.unit.fakeoftable import CONTROLLER, FakeDatapath, FakeOFTable, Packet

DP = FakeDatapath(1)
NET2 = ("10.1.2.0", "255.255.255.0")


def table(*ops):
    t = FakeOFTable("t")
    for op in ops:
        t.apply(openflow.messages(DP, op))
    return t


def flow(priority, action, **fields):
    return ("flow_add", Flow(priority, match(**fields), action))


def ports(choices):
    return [[port for port, _p in choice] for choice in choices]


def test_the_highest_priority_match_wins_and_masks_select_prefixes():
    t = table(("group_add", 1, (3, 4)),
              flow(100, ("group", 1), eth_type=0x0800, ipv4_dst=NET2),
              flow(500, ("output", 7), eth_type=0x0800, ipv4_dst="10.1.2.9"),
              flow(200, ("output", 8), eth_type=0x0800, in_port=1, ipv4_dst=NET2))
    assert ports(t.forward(Packet(in_port=2, ipv4_dst="10.1.2.5"))) == [[3], [4]]      # select: either
    assert ports(t.forward(Packet(in_port=2, ipv4_dst="10.1.2.9"))) == [[7]]
    assert ports(t.forward(Packet(in_port=1, ipv4_dst="10.1.2.5"))) == [[8]]
    assert ports(t.forward(Packet(in_port=1, ipv4_dst="10.1.3.5"))) == [[]]            # a miss drops


def test_watched_members_and_failover_follow_port_liveness():
    t = table(("group_add", 1, (3, 4)), ("group_add", 2, FailoverGroup(5, 1)),
              flow(100, ("group", 2), eth_type=0x0800, ipv4_dst=NET2))
    packet = Packet(in_port=1, ipv4_dst="10.1.2.5")
    assert ports(t.forward(packet)) == [[5]]
    t.set_port(5, False)
    assert ports(t.forward(packet)) == [[3], [4]]             # on to the select group
    t.set_port(3, False)
    assert ports(t.forward(packet)) == [[4]]
    t.set_port(4, False)
    assert ports(t.forward(packet)) == [[]]                   # nothing live: dropped


def test_all_groups_copy_with_their_own_rewrites_and_in_port_hairpins():
    group = ReplicateGroup((Rewrite("02:00:00:00:00:01", "10.1.1.1", IN_PORT),
                            Rewrite("02:00:00:00:00:02", "10.1.1.2", 2)))
    t = table(("group_add", 9, group), flow(900, ("group", 9), eth_type=0x0800, ipv4_dst="10.1.254.1"),
              flow(800, ("output", 1), eth_type=0x0800, ipv4_dst="10.1.1.1"))
    (copies,) = t.forward(Packet(in_port=1, ipv4_dst="10.1.254.1"))
    assert [(port, p.eth_dst, p.ipv4_dst) for port, p in copies] == \
        [(1, "02:00:00:00:00:01", "10.1.1.1"), (2, "02:00:00:00:00:02", "10.1.1.2")]
    # a plain output to the port the packet came in by is dropped, as OpenFlow does
    assert ports(t.forward(Packet(in_port=1, ipv4_dst="10.1.1.1"))) == [[]]


def test_the_controller_is_a_destination_of_its_own():
    t = table(flow(1000, ("controller",), eth_type=0x0806))
    assert ports(t.forward(Packet(in_port=1, ipv4_dst="", eth_type=0x0806))) == [[CONTROLLER]]


@pytest.mark.parametrize("ops, words", [
    ([flow(100, ("group", 1), eth_type=0x0800, ipv4_dst=NET2)], "flow added before its group"),
    ([("group_add", 1, (3,)), ("group_add", 1, (4,))], "added twice"),
    ([("group_mod", 1, (3,))], "modified before it exists"),
    ([("group_add", 2, FailoverGroup(5, 1))], "chains to missing group"),
    ([("group_add", 1, (3,)), ("group_add", 2, FailoverGroup(5, 1)), ("group_del", 1)], "chain to it"),
    ([("flow_del", Flow(1, match(eth_type=0x0800), ("output", 1)))], "not there"),
])
def test_unsafe_orders_are_refused(ops, words):
    with pytest.raises(AssertionError, match=words):
        table(*ops)


def test_two_entries_of_one_priority_for_one_packet_are_refused():
    t = table(flow(100, ("output", 1), eth_type=0x0800, ipv4_dst=NET2),
              flow(100, ("output", 2), eth_type=0x0800, in_port=3))
    with pytest.raises(AssertionError, match="matches 2 entries of priority 100"):
        t.forward(Packet(in_port=3, ipv4_dst="10.1.2.1"))
