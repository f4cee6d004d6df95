"""Max-flow, random link failures and the 3-tier graph of the flow model (hand-computed values)."""

import json
import random

import pytest

from fabriclab.cli.main import main
from fabriclab.model import evaluate, failures, flows
from fabriclab.model.bench import run_size
from fabriclab.model.graph import ClosGraph, ClosParams
from fabriclab.model.maxflow import leaf_pair_capacity, leaf_pair_max_flow, max_flow
from fabriclab.model.routes import Routes
from fabriclab.topologies.spec import load_spec

MIB = 2**20


def cable(graph, label):
    found = [c for c in graph.fabric_cables() if graph.link_label(2 * c) == label]
    assert len(found) == 1, label
    return found[0]


# -- max-flow ----------------------------------------------------------------------------------------

def test_max_flow_textbook_network():
    # The 6-node network of Cormen et al. (Introduction to Algorithms, Figure 26.1): 23.
    edges = [(0, 1, 16), (0, 2, 13), (1, 3, 12), (2, 1, 4), (2, 4, 14), (3, 2, 9), (3, 5, 20),
             (4, 3, 7), (4, 5, 4)]
    assert max_flow(6, edges, 0, 5) == pytest.approx(23)


def test_max_flow_small_cases():
    assert max_flow(3, [(0, 1, 5), (1, 2, 3)], 0, 2) == 3                    # series: the minimum
    assert max_flow(2, [(0, 1, 2), (0, 1, 3.5)], 0, 1) == pytest.approx(5.5)  # parallel: the sum
    assert max_flow(3, [(0, 1, 5)], 0, 2) == 0                               # no path
    # The flow must undo a bad first choice through the residual edge 1->2 -> back.
    assert max_flow(4, [(0, 1, 1), (0, 2, 1), (1, 2, 1), (1, 3, 1), (2, 3, 1)], 0, 3) == 2
    with pytest.raises(ValueError):
        max_flow(2, [(0, 1, -1)], 0, 1)


def test_leaf_pair_capacity_by_hand():
    # tiny: 2 leaves x 2 spines at 10 Mbit/s: 20 between the leaves; with l1-s1 down, 10.
    graph = ClosGraph.from_spec(load_spec("tiny"))
    assert leaf_pair_capacity(graph) == [20.0]
    assert leaf_pair_capacity(graph, {cable(graph, "l1-s1")}) == [10.0]
    # parallel_links: 4 leaves x 2 spines x 2 members: 40 per pair; l1 loses 3 of its 4 links.
    graph = ClosGraph.from_spec(load_spec("parallel_links"))
    down = {cable(graph, x) for x in ("l1-s1", "l1-s1#2", "l1-s2")}
    caps = leaf_pair_capacity(graph, down)
    assert caps[:3] == [10.0, 10.0, 10.0]                 # pairs (l1, l2..l4)
    assert caps[3:] == [40.0] * 3                        # pairs among l2..l4


def test_valley_free_and_unrestricted_max_flow_differ_only_through_other_leaves():
    # 3 leaves x 2 spines; l1 keeps only s2, l2 keeps only s1: no up-down path between them,
    # but l1 -> s2 -> l3 -> s1 -> l2 carries 10.
    graph = ClosGraph(ClosParams(leaves=3, spines=2, hosts_per_leaf=1))
    down = {cable(graph, "l1-s1"), cable(graph, "l2-s2")}
    l1, l2 = graph.leaf_id[1, 1], graph.leaf_id[1, 2]
    assert leaf_pair_max_flow(graph, l1, l2, down) == 0
    assert leaf_pair_max_flow(graph, l1, l2, down, valley_free=False) == pytest.approx(10)
    assert leaf_pair_capacity(graph, down)[0] == 0
    # ... and the lab's shortest-path routing takes that detour too (paths.py does).
    assert Routes(graph, down).reachable(l1, l2)


@pytest.mark.parametrize("params", [
    ClosParams(leaves=4, spines=3, hosts_per_leaf=1, parallel_links=2),
    ClosParams(pods=3, leaves=2, spines=2, superspines=3, hosts_per_leaf=1, core_rate_mbps=4.0),
    ClosParams(planes=2, leaves=3, spines=2, hosts_per_leaf=1, parallel_links=2),
], ids=["2-tier", "3-tier", "multiplane"])
def test_closed_form_equals_dinic_under_random_failures(params):
    graph = ClosGraph(params)
    rng = random.Random(3)
    for _ in range(5):
        down = failures.failed_cables(graph, 0.3, rng)
        closed = leaf_pair_capacity(graph, down)
        dinic = []
        for plane in range(1, params.planes + 1):
            leaves = [graph.leaf_id[plane, i + 1] for i in range(params.pods * params.leaves)]
            dinic += [leaf_pair_max_flow(graph, a, b, down)
                      for i, a in enumerate(leaves) for b in leaves[i + 1:]]
        assert closed == pytest.approx(dinic)


# -- failure studies -------------------------------------------------------------------------------------

def test_no_failures_leave_full_capacity_and_no_slowdown():
    graph = ClosGraph.from_spec(load_spec("default"))
    found = failures.study(graph, [0.0], trials=3, seed=1, collective=flows.alltoall(graph, MIB),
                           schemes=("ecmp", "ideal"))
    row = found["rows"][0]
    assert row["failed_cables"] == 0
    cap = row["capacity"]
    assert cap["samples"] == 6 * 3 and cap["min"] == 1.0 and cap["mean"] == 1.0
    assert cap["below_full"] == 0 and cap["cdf"][-2] == [0.95, 0.0] and cap["cdf"][-1] == [1.0, 1.0]
    assert all(c["slowdown_mean"] == pytest.approx(1.0) for c in row["cct"].values())


def test_failures_are_seeded_and_sized():
    graph = ClosGraph.from_spec(load_spec("parallel_links"))         # 16 fabric cables
    one = failures.failed_cables(graph, 0.25, failures.trial_rng(5, 0.25, 0))
    assert len(one) == 4 and one == failures.failed_cables(graph, 0.25, failures.trial_rng(5, 0.25, 0))
    assert one <= set(graph.fabric_cables())
    assert failures.failed_cables(graph, 0.25, failures.trial_rng(6, 0.25, 0)) != one
    # 5 % of 16 cables is 0.8: one cable fails (rounded), not none (truncated).
    assert len(failures.failed_cables(graph, 0.05, failures.trial_rng(5, 0.05, 0))) == 1


def test_one_failed_cable_of_sixteen_by_hand():
    # default: 4 leaves x 4 spines. One cable l_a-s_k down: the 3 pairs with l_a drop to 3/4,
    # the other 3 pairs keep 100 %: min 0.75, median 0.75, mean 0.875, half the pairs below.
    graph = ClosGraph.from_spec(load_spec("default"))
    row = failures.study(graph, [1 / 16], trials=4, seed=0)["rows"][0]
    cap = row["capacity"]
    assert row["failed_cables"] == 1
    assert cap["min"] == 0.75 and cap["mean"] == pytest.approx(0.875) and cap["below_full"] == 0.5
    assert dict((x, y) for x, y in cap["cdf"])[0.75] == 0.5


def test_percentiles_nearest_rank():
    values = sorted(i / 100 for i in range(1, 101))
    assert failures.percentile(values, 1) == 0.01 and failures.percentile(values, 50) == 0.5
    assert failures.percentile([0.2], 5) == 0.2 and failures.percentile([], 5) is None


def test_failures_command_json(capsys):
    assert main(["model", "failures", "default", "--fraction", "0,0.125", "--trials", "3", "--size", "1M",
                 "--routing", "ecmp,te", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "model" and doc["model"] == "failures" and doc["scale"]["time_scale"] == 20000
    assert [r["failed_cables"] for r in doc["rows"]] == [0, 2]
    assert doc["rows"][0]["capacity"]["min"] == 1.0
    assert doc["rows"][1]["capacity"]["min"] < 1.0
    assert set(doc["rows"][1]["cct"]) == {"ecmp", "te"}
    assert main(["model", "failures", "tiny", "--collective", "none", "--fraction", "0.5"]) == 0
    assert "Leaf-pair max-flow" in capsys.readouterr().out


# -- 3-tier ------------------------------------------------------------------------------------------

def test_three_tier_graph_shape_and_paths():
    # 2 pods x (2 leaves, 2 spines), 2 super-spines per spine group, 2 hosts per leaf.
    graph = ClosGraph(ClosParams(pods=2, leaves=2, spines=2, superspines=2))
    assert graph.n_switches == 4 + 4 + 4 and graph.params.hosts == 8
    assert graph.n_cables == 8 + 2 * 2 * 2 + 2 * 2 * 2       # host + leaf-spine + spine-superspine
    assert [graph.sw_name[n] for n in graph.adj[graph.spine_id[1, 0, 1]]] == ["l1", "l2", "ss3", "ss4"]
    routes = Routes(graph)
    l1, l2, l3 = (graph.leaf_id[1, i] for i in (1, 2, 3))
    assert routes.dist(l3)[l1] == 4 and routes.dist(l2)[l1] == 2
    # Inter-pod up-down capacity: per spine index min(10, 2 x 10, 10) = 10, two indices: 20.
    caps = leaf_pair_capacity(graph)
    assert caps == [20.0] * 6


def test_three_tier_core_rate_sets_the_cct_by_hand():
    # One host in each of 2 pods, one leaf, spine and super-spine: h1 l1 s1 ss1 s2 l2 h2.
    # With 10 Mbit/s everywhere a 1 MiB ring AllReduce takes 2 x 512 KiB / 10 Mbit/s; a 5 Mbit/s
    # core link halves the rate and doubles the time.
    fast = ClosGraph(ClosParams(pods=2, leaves=1, spines=1, superspines=1, hosts_per_leaf=1))
    slow = ClosGraph(ClosParams(pods=2, leaves=1, spines=1, superspines=1, hosts_per_leaf=1,
                                core_rate_mbps=5.0))
    for graph, rate in ((fast, 10e6), (slow, 5e6)):
        out = evaluate.run(graph, Routes(graph), flows.ring_allreduce(graph, MIB), "ecmp")
        assert out.cct_s == pytest.approx(2 * MIB / 2 * 8 / rate)
        assert len(out.loads) == 2 * 6          # both directions of 6 links: 2 host, 4 fabric


def test_benchmark_row_is_complete():
    row = run_size(4, 2, 2, ["ecmp", "ideal"])
    assert row["endpoints"] == 8 and row["flows"] == 8 and row["leaf_pairs"] == 6
    assert {"build_s", "routes_s", "ecmp_s", "ideal_s", "maxflow_s", "failure_trial_s"} <= set(row)
    assert row["cct_s"]["ecmp"] >= row["cct_s"]["ideal"] > 0


def test_benchmark_row_in_its_own_process_has_its_peak_memory():
    from fabriclab.model.bench import run_size_alone

    row = run_size_alone(4, 2, 2, ["ecmp"])
    assert row["endpoints"] == 8 and row["cct_s"]["ecmp"] > 0
    # a Python process with numpy and scipy loaded: tens of MB, far from 0 or terabytes
    assert 10 < row["peak_rss_mb"] < 2000


def test_benchmark_cli_prints_peak_memory(capsys):
    assert main(["model", "benchmark", "--sizes", "4x2x2", "--routing", "ecmp"]) == 0
    out = capsys.readouterr().out
    assert "peak MB" in out and "4x2x2" in out
