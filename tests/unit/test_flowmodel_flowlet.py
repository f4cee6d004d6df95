"""Flowlet switching in the flow model: least-loaded choice per flowlet, ties from the hash.
Each test here would fail if flowlet were ECMP."""

import statistics

import pytest

from fabriclab.model import evaluate, flows, placement, splitting
from fabriclab.model.graph import ClosGraph, ClosParams
from fabriclab.model.maxmin import max_min_rates
from fabriclab.model.routes import Routes

MIB = 2**20


def uplink_loads(graph, placed, leaf):
    counts = {e: 0 for links in graph.adj[leaf].values() for e in links}
    for route in placed.routes:
        for e in placement.fabric_links(route)[:1]:
            if e in counts:
                counts[e] += 1
    return sorted(counts.values())


def test_a_leafs_flowlets_spread_over_its_uplinks_where_ecmp_collides():
    # l1's 4 hosts each send one flow to a host on l2, over 4 spines. Flowlet: each starts on
    # the least-loaded uplink, so one per uplink, for every hash seed. ECMP hashes 4 flows onto
    # 4 uplinks: some seed collides (4!/4^4 = 9% of seeds spread them perfectly).
    graph = ClosGraph(ClosParams(leaves=2, spines=4, hosts_per_leaf=4))
    fl = flows.connection_flows(graph, [(i, 4 + i) for i in range(4)], MIB)
    l1 = graph.leaf_id[1, 1]
    routes = Routes(graph)
    collided = 0
    for seed in range(20):
        assert uplink_loads(graph, placement.place(graph, routes, fl, "flowlet", seed), l1) == [1, 1, 1, 1]
        collided += uplink_loads(graph, placement.place(graph, routes, fl, "ecmp", seed), l1) != [1, 1, 1, 1]
    assert collided >= 10


def test_one_flowlet_alone_takes_the_hash_member():
    # Nothing loaded yet: the scan starts at the stage hash's member (from the leaf's basis, as the
    # lab's flowlet stage) and takes it.
    graph = ClosGraph(ClosParams(leaves=2, spines=4, hosts_per_leaf=1))
    fl = flows.connection_flows(graph, [(0, 1)], MIB)
    routes = Routes(graph)
    leaf = splitting.leaf_of(graph, fl[0].src)
    opts = routes.options_array(leaf, splitting.leaf_of(graph, fl[0].dst))
    for seed in range(8):
        basis = placement.switch_seeds(graph, seed)[leaf]
        first = placement.place(graph, routes, fl, "flowlet", seed).routes[0][1][0]
        assert first == int(opts[placement.flow_hash(graph, fl[0], basis=basis) % len(opts)])


def test_flowlet_is_blind_to_the_links_after_the_first_choice():
    # l1 and l2 each send one flow to l3 (two hosts there), 2 spines. Each leaf's choice is
    # its own: whenever the two hash onto the same spine they share that spine's link into l3,
    # which TE (and the optimum) never do. Some seed shows it; flowlet is then at half rate.
    graph = ClosGraph(ClosParams(leaves=3, spines=2, hosts_per_leaf=2))
    fl = flows.connection_flows(graph, [(0, 4), (2, 5)], MIB)
    routes = Routes(graph)
    slow = [seed for seed in range(16)
            if min(max_min_rates(graph.link_cap, placement.place(graph, routes, fl, "flowlet", seed).routes)) < 10]
    assert slow
    assert min(max_min_rates(graph.link_cap, placement.place(graph, routes, fl, "te").routes)) == 10


def test_shuffled_ring_flowlet_between_ecmp_and_ideal():
    # 1:1, 256 endpoints, a shuffled ring: flowlet spreads every leaf's flows over its uplinks
    # (up max/mean 1.0, ECMP's is higher) but collides on the way down, so its CCT lies
    # between ideal's and ECMP's, averaged over hash seeds.
    graph = ClosGraph(ClosParams(leaves=32, spines=8, hosts_per_leaf=8))
    ring = flows.ring_allreduce(graph, 2**26, order="shuffled", seed=0)
    routes = Routes(graph)
    cct = {s: [] for s in ("ecmp", "flowlet")}
    for seed in range(4):
        for s in cct:
            out = evaluate.run(graph, routes, ring, s, seed)
            cct[s].append(out.cct_s)
            up = evaluate.balance(graph, routes, out.loads)["up"]
            if s == "flowlet":
                assert up["max_mbps"] == pytest.approx(10.0)      # never two flows on an uplink
    ideal = evaluate.run(graph, routes, ring, "ideal").cct_s
    assert ideal <= min(cct["flowlet"]) and statistics.fmean(cct["flowlet"]) < statistics.fmean(cct["ecmp"])
