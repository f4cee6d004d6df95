"""Shortest paths and next hops over the fabric graph, and LinkState that says which links are up.

Failures are given as sets of Link.key, as LinkState.down_links() produces them.
"""

import itertools
import random

import pytest

from fabriclab.apps.linkstate import LinkState
from fabriclab.apps.paths import all_paths, next_hops
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import FabricSpec, load_spec


def fabric(**fields):
    return Fabric(FabricSpec(name="t", **fields))


def keys(fab, node1, node2, member=None):
    return {link.key for link in fab.find_link(node1, node2, member)}


def port_to(fab, switch, neighbour):
    """Ports of `switch` cabled to `neighbour`, sorted."""
    ports = []
    for link in fab.find_link(switch, neighbour):
        ports.append(link.a_port if link.a == switch else link.b_port)
    return sorted(ports)


def uplinks(fab, leaf):
    return sorted(p for spine in spines(fab, fab.switches[leaf].plane) for p in port_to(fab, leaf, spine))


def spines(fab, plane=1):
    return [s.name for s in fab.switches.values() if s.role == "spine" and s.plane == plane]


def neighbour_at(fab):
    """(switch, port) -> the switch at the other end of that fabric link."""
    table = {}
    for link in fab.fabric_links:
        table[(link.a, link.a_port)] = link.b
        table[(link.b, link.b_port)] = link.a
    return table


# -- next hops, nothing failed --------------------------------------------------------------------------

def test_leaf_uses_every_spine_port_for_every_remote_leaf():
    fab = fabric(leaves=3, spines=4, hosts_per_leaf=2)
    hops = next_hops(fab)
    for leaf in ("l1", "l2", "l3"):
        assert sorted(hops[leaf]) == sorted({"l1", "l2", "l3"} - {leaf}), "a leaf does not list itself"
        for ports in hops[leaf].values():
            assert ports == uplinks(fab, leaf) == [3, 4, 5, 6]


def test_spine_sends_each_leaf_down_its_own_link():
    fab = fabric(leaves=3, spines=2, hosts_per_leaf=1)
    hops = next_hops(fab)
    for spine in ("s1", "s2"):
        assert hops[spine] == {"l1": [1], "l2": [2], "l3": [3]}


def test_parallel_links_multiply_the_members():
    fab = fabric(leaves=2, spines=3, hosts_per_leaf=2, parallel_links=2)
    hops = next_hops(fab)
    assert hops["l1"]["l2"] == uplinks(fab, "l1")
    assert len(hops["l1"]["l2"]) == 3 * 2
    assert hops["s2"] == {"l1": [1, 2], "l2": [3, 4]}


def test_ports_are_sorted_and_unique():
    fab = Fabric(load_spec("parallel_links"))
    for table in next_hops(fab).values():
        for ports in table.values():
            assert ports == sorted(set(ports))


# -- next hops after failures ------------------------------------------------------------------------------

def test_a_failed_uplink_is_dropped_at_its_leaf_and_remotely():
    fab = fabric(leaves=3, spines=3, hosts_per_leaf=1)
    dead = port_to(fab, "l1", "s2")
    hops = next_hops(fab, keys(fab, "l1", "s2"))
    # the leaf itself stops using that port for every remote leaf
    for remote in ("l2", "l3"):
        assert hops["l1"][remote] == sorted(set(uplinks(fab, "l1")) - set(dead))
    # the remote-failure case: the other leaves stop sending l1's prefix to s2 ...
    for other in ("l2", "l3"):
        assert hops[other]["l1"] == sorted(set(uplinks(fab, other)) - set(port_to(fab, other, "s2")))
        # ... but keep s2 for destinations it still reaches directly
        remaining = {"l2", "l3"} - {other}
        for remote in remaining:
            assert hops[other][remote] == uplinks(fab, other)
    # s2 no longer has its direct port to l1
    assert port_to(fab, "s2", "l1")[0] not in hops["s2"]["l1"]
    assert hops["s1"]["l1"] == port_to(fab, "s1", "l1")


def test_one_failed_parallel_member_keeps_the_spine_for_other_leaves():
    fab = fabric(leaves=2, spines=2, hosts_per_leaf=1, parallel_links=2)
    failed = fab.find_link("l1", "s1", member=0)[0]
    hops = next_hops(fab, {failed.key})
    assert hops["l1"]["l2"] == sorted(set(uplinks(fab, "l1")) - {failed.a_port})
    assert hops["l2"]["l1"] == uplinks(fab, "l2"), "s1 still reaches l1 over the other member"
    assert hops["s1"]["l1"] == [failed.b_port + 1]


def test_a_leaf_cut_off_from_every_spine_is_dropped_not_looped():
    fab = fabric(leaves=3, spines=2, hosts_per_leaf=1, parallel_links=2)
    down = keys(fab, "l1", "s1") | keys(fab, "l1", "s2")
    hops = next_hops(fab, down)
    for switch in ("l2", "l3", "s1", "s2"):
        assert hops[switch]["l1"] == []
    assert hops["l1"] == {"l2": [], "l3": []}
    assert hops["l2"]["l3"] == uplinks(fab, "l2")


def test_a_spine_that_lost_every_link_is_avoided():
    fab = fabric(leaves=3, spines=3, hosts_per_leaf=1)
    down = set().union(*(keys(fab, leaf, "s3") for leaf in ("l1", "l2", "l3")))
    hops = next_hops(fab, down)
    assert hops["s3"] == {"l1": [], "l2": [], "l3": []}
    for leaf in ("l1", "l2", "l3"):
        for ports in hops[leaf].values():
            assert ports == sorted(set(uplinks(fab, leaf)) - set(port_to(fab, leaf, "s3")))


def black_holes(fab, hops, dst):
    """Follow every next hop toward dst from every switch of its plane, failing on any loop.

    Returns the switches from which some walk ends somewhere other than dst (an empty group)."""
    across = neighbour_at(fab)
    stuck = set()

    def walk(node, seen):
        if node == dst:
            return
        ports = hops[node][dst]
        if not ports:
            stuck.add(seen[0])
            return
        for port in ports:
            nxt = across[(node, port)]
            assert nxt not in seen, f"loop toward {dst}: {seen + [nxt]}"
            walk(nxt, seen + [nxt])

    for switch in fab.switches.values():
        if switch.name != dst and switch.plane == fab.switches[dst].plane:
            walk(switch.name, [switch.name])
    return stuck


@pytest.mark.parametrize("spec_name", ["default", "parallel_links", "spectrumx_fig16"])
def test_random_failures_never_loop_and_never_black_hole_a_reachable_leaf(spec_name):
    fab = Fabric(load_spec(spec_name))
    rng = random.Random(spec_name)
    links = fab.fabric_links
    for trial in range(40):
        down = {link.key for link in rng.sample(links, rng.randint(1, len(links) // 2))}
        hops = next_hops(fab, down)
        for dst in fab.leaves():
            stuck = black_holes(fab, hops, dst.name)
            for src in fab.leaves(dst.plane):
                if src.name != dst.name and all_paths(fab, src.name, dst.name, down):
                    assert src.name not in stuck, (trial, src.name, dst.name)


def test_multiplane_switches_never_route_to_another_planes_prefixes():
    fab = Fabric(load_spec("spectrumx_fig16"))
    hops = next_hops(fab)
    for switch in fab.switches.values():
        destinations = {fab.switches[leaf].plane for leaf in hops[switch.name]}
        assert destinations == {switch.plane}
        own_ports = set(fab.switch_ports(switch.name))
        for ports in hops[switch.name].values():
            assert ports and set(ports) <= own_ports


def test_a_failure_in_one_plane_leaves_the_others_alone():
    fab = fabric(kind="multiplane", planes=3, leaves=2, spines=2, hosts_per_leaf=1)
    before = next_hops(fab)
    after = next_hops(fab, keys(fab, "p2l1", "p2s1"))
    changed = {name for name in fab.switches if before[name] != after[name]}
    assert changed == {"p2l1", "p2l2", "p2s1"}


# -- all paths -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spines_, parallel", [(1, 1), (2, 1), (4, 1), (2, 2), (3, 3)])
def test_all_paths_counts(spines_, parallel):
    fab = fabric(leaves=3, spines=spines_, hosts_per_leaf=1, parallel_links=parallel)
    paths = all_paths(fab, "l1", "l3")
    # every uplink member to every spine, then every downlink member from it
    assert len(paths) == spines_ * parallel * parallel
    assert len({tuple(link.key for link in path) for path in paths}) == len(paths)


def test_paths_are_loop_free_shortest_and_connected():
    fab = Fabric(load_spec("parallel_links"))
    for src, dst in itertools.permutations([leaf.name for leaf in fab.leaves()], 2):
        for path in all_paths(fab, src, dst):
            assert len(path) == 2
            nodes = [src]
            for link in path:
                assert nodes[-1] in (link.a, link.b)
                nodes.append(link.b if link.a == nodes[-1] else link.a)
            assert nodes[-1] == dst
            assert len(set(nodes)) == len(nodes)
            assert fab.switches[nodes[1]].role == "spine"


def test_all_paths_agrees_with_next_hops():
    fab = fabric(leaves=3, spines=3, hosts_per_leaf=1, parallel_links=2)
    down = keys(fab, "l1", "s1", member=1) | keys(fab, "l3", "s2")
    hops = next_hops(fab, down)
    for src, dst in itertools.permutations(["l1", "l2", "l3"], 2):
        paths = all_paths(fab, src, dst, down)
        first_hops = {path[0].a_port if path[0].a == src else path[0].b_port for path in paths}
        assert first_hops == set(hops[src][dst])
        assert all(link.key not in down for path in paths for link in path)


def test_all_paths_after_failures():
    fab = fabric(leaves=2, spines=3, hosts_per_leaf=1)
    assert len(all_paths(fab, "l1", "l2", keys(fab, "l1", "s1"))) == 2
    # with s1 and s2 cut from l2, the only shortest way is over s3
    only = all_paths(fab, "l1", "l2", keys(fab, "l2", "s1") | keys(fab, "l2", "s2"))
    assert [[link.b for link in path] for path in only] == [["s3", "s3"]]
    isolated = set().union(*(keys(fab, "l2", s) for s in ("s1", "s2", "s3")))
    assert all_paths(fab, "l1", "l2", isolated) == []


def test_longer_detour_is_found_when_no_two_hop_path_is_left():
    # l1 reaches only s1, l2 only s2: l1 - s1 - l3 - s2 - l2 is the shortest path left.
    fab = fabric(leaves=3, spines=2, hosts_per_leaf=1)
    down = keys(fab, "l1", "s2") | keys(fab, "l2", "s1")
    (path,) = all_paths(fab, "l1", "l2", down)
    assert [(link.a, link.b) for link in path] == [("l1", "s1"), ("l3", "s1"), ("l3", "s2"), ("l2", "s2")]
    assert next_hops(fab, down)["l1"]["l2"] == port_to(fab, "l1", "s1")


def test_all_paths_to_itself_and_across_planes():
    fab = fabric(kind="multiplane", planes=2, leaves=2, spines=2, hosts_per_leaf=1)
    assert all_paths(fab, "p1l1", "p1l1") == [[]]
    assert all_paths(fab, "p1l1", "p2l2") == []
    assert len(all_paths(fab, "p2l1", "p2l2")) == 2


# -- LinkState ---------------------------------------------------------------------------------------------------

def connect_all(fab, state, live=True):
    for name in fab.switches:
        ports = {port: (intf, live) for port, intf in fab.switch_ports(name).items()}
        state.switch_connected(name, ports)


@pytest.fixture
def fab():
    return fabric(leaves=2, spines=2, hosts_per_leaf=2)


@pytest.fixture
def state(fab):
    links = LinkState(fab)
    connect_all(fab, links)
    return links


def test_everything_is_down_before_switches_connect(fab):
    links = LinkState(fab)
    assert links.down_links() == {link.key for link in fab.fabric_links}
    assert links.down_host_ports() == {(link.b, link.b_port) for link in fab.host_links}


def test_all_up_once_every_switch_reports_live_ports(fab, state):
    assert state.down_links() == frozenset()
    assert state.down_host_ports() == frozenset()
    assert all(problems == [] for problems in state.mismatches.values())


@pytest.mark.parametrize("end", ["leaf", "spine"])
def test_a_link_is_down_when_either_ports_is(fab, state, end):
    (link,) = fab.find_link("l1", "s2")
    switch, port = (link.a, link.a_port) if end == "leaf" else (link.b, link.b_port)
    assert state.port_changed(switch, port, False) is True
    assert state.down_links() == {link.key}
    assert state.port_changed(switch, port, True) is True
    assert state.down_links() == frozenset()


def test_a_disconnected_switch_takes_its_links_down(fab, state):
    state.switch_disconnected("s1")
    assert state.down_links() == {link.key for link in fab.fabric_links if link.b == "s1"}
    assert state.down_host_ports() == frozenset()
    state.switch_disconnected("l2")
    assert state.down_host_ports() == {("l2", 1), ("l2", 2)}
    assert not state.port_up("l2", 3)


def test_reconnecting_restores_the_links(fab, state):
    state.switch_disconnected("s1")
    connect_all(fab, state)
    assert state.down_links() == frozenset()


def test_a_port_reported_dead_at_connection_is_down(fab):
    links = LinkState(fab)
    connect_all(fab, links)
    ports = {port: (intf, port != 3) for port, intf in fab.switch_ports("l1").items()}
    links.switch_connected("l1", ports)
    assert links.down_links() == {fab.find_link("l1", "s1")[0].key}


def test_host_port_down(fab, state):
    assert state.port_changed("l1", 2, False) is True
    assert state.down_host_ports() == {("l1", 2)}
    assert state.down_links() == frozenset()


def test_port_changed_ignores_unknown_ports_and_no_op_changes(fab, state):
    assert state.port_changed("l1", 99, False) is False        # not cabled in the fabric
    assert state.port_changed("l1", 0xFFFFFFFE, False) is False  # OFPP_LOCAL
    assert state.port_changed("nope", 1, False) is False       # not a fabric switch
    assert state.port_changed("l1", 3, True) is False          # already up
    assert state.port_changed("l1", 3, False) is True
    assert state.port_changed("l1", 3, False) is False         # already down
    assert state.down_links() == {fab.find_link("l1", "s1")[0].key}


def test_port_status_before_the_port_description_is_ignored(fab):
    links = LinkState(fab)
    assert links.port_changed("l1", 3, True) is False
    assert not links.port_up("l1", 3)


def test_mismatch_for_a_missing_port(fab):
    links = LinkState(fab)
    ports = {port: (intf, True) for port, intf in fab.switch_ports("l1").items() if port != 4}
    links.switch_connected("l1", ports)
    assert links.mismatches["l1"] == ["l1: port 4 (l1-eth4) missing"]
    assert not links.port_up("l1", 4)


def test_mismatch_for_a_renamed_port(fab):
    links = LinkState(fab)
    ports = {port: (intf, True) for port, intf in fab.switch_ports("s2").items()}
    ports[2] = ("s2-eth9", True)
    links.switch_connected("s2", ports)
    assert links.mismatches["s2"] == ["s2: port 2 is s2-eth9, spec says s2-eth2"]


def test_extra_ports_are_not_a_mismatch_and_a_clean_reconnect_clears_it(fab):
    links = LinkState(fab)
    ports = {port: (intf, True) for port, intf in fab.switch_ports("l1").items()}
    links.switch_connected("l1", {**ports, 1: ("wrong", True)})
    assert links.mismatches["l1"] == ["l1: port 1 is wrong, spec says l1-eth1"]
    links.switch_connected("l1", {**ports, 0xFFFFFFFE: ("l1", True), 42: ("l1-eth42", True)})
    assert links.mismatches["l1"] == []


def test_linkstate_drives_next_hops(fab, state):
    (link,) = fab.find_link("l2", "s2")
    state.port_changed("s2", link.b_port, False)
    hops = next_hops(fab, state.down_links())
    assert hops["l1"]["l2"] == port_to(fab, "l1", "s1")
    assert hops["l2"]["l1"] == port_to(fab, "l2", "s1")
