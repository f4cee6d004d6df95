"""The flow-level fabric model: max-min rates, routing schemes, step-wise CCT, the CLI.

Expected values are worked out by hand in the comments; rates in Mbit/s, times in seconds.
"""

import json
import pathlib
import random
import re
import statistics

import pytest

from fabriclab.apps.paths import next_hops
from fabriclab.cli.main import main
from fabriclab.errors import LabError
from fabriclab.model import evaluate, flows, placement
from fabriclab.model.graph import ClosGraph, ClosParams
from fabriclab.model.maxmin import link_loads, max_min_rates
from fabriclab.model.routes import Routes
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec

MIB = 2**20


def cable(graph, label):
    """The cable id of a link label such as 'l1-s2' or 'l1-s2#2'."""
    found = [c for c in graph.fabric_cables() if graph.link_label(2 * c) == label]
    assert len(found) == 1, label
    return found[0]


def single(*links):
    return [(e, 1.0) for e in links]


# -- max-min fairness -------------------------------------------------------------------------------

def test_maxmin_two_links_by_hand():
    # link 0 (cap 1): f0, f1; link 1 (cap 10): f1, f2. Link 0 fills first at 0.5 each;
    # f2 then takes what f1 leaves on link 1: 10 - 0.5 = 9.5.
    rates = max_min_rates([1.0, 10.0], [single(0), single(0, 1), single(1)])
    assert rates == pytest.approx([0.5, 0.5, 9.5])


def test_maxmin_parking_lot_by_hand():
    # Three unit links in a row; one flow crosses all three, one short flow on each link:
    # every link has two flows, so everyone gets 1/2.
    long = single(0, 1, 2)
    rates = max_min_rates([1.0, 1.0, 1.0], [long, single(0), single(1), single(2)])
    assert rates == pytest.approx([0.5] * 4)
    # Unequal: link 0 cap 10 (f0, f1), link 1 cap 4 (f0, f2): link 1 fills at 2; f1 gets 10 - 2.
    assert max_min_rates([10.0, 4.0], [single(0, 1), single(0), single(1)]) == pytest.approx([2, 8, 2])


def test_maxmin_split_flow_by_hand():
    # f0 puts half of its traffic on each of links 0 and 1 (cap 1 each); f1 uses link 0 only.
    # Link 0 carries 0.5 r0 + r1: at a common level r, 1.5 r = 1 -> r = 2/3 for both.
    rates = max_min_rates([1.0, 1.0], [[(0, 0.5), (1, 0.5)], single(0)])
    assert rates == pytest.approx([2 / 3, 2 / 3])
    loads = link_loads([[(0, 0.5), (1, 0.5)], single(0)], rates)
    assert loads[0] == pytest.approx(1.0) and loads[1] == pytest.approx(1 / 3)


def test_maxmin_unroutable_flow_gets_nothing():
    assert max_min_rates([5.0], [None, single(0), []]) == [0.0, 5.0, 0.0]


def test_maxmin_is_max_min_fair_on_random_instances():
    # The defining property: every flow crosses a full link on which no flow is faster.
    rng = random.Random(7)
    for _ in range(30):
        caps = [rng.choice([1.0, 2.0, 5.0, 10.0]) for _ in range(12)]
        routes = [single(*rng.sample(range(12), rng.randint(1, 4))) for _ in range(25)]
        rates = max_min_rates(caps, routes)
        loads = link_loads(routes, rates)
        assert all(loads.get(e, 0) <= caps[e] * (1 + 1e-9) for e in range(12))
        for f, route in enumerate(routes):
            assert any(loads[e] >= caps[e] * (1 - 1e-9)
                       and all(rates[g] <= rates[f] * (1 + 1e-9) for g, r in enumerate(routes)
                               if e in {x for x, _ in r})
                       for e, _ in route), f"flow {f} has no bottleneck"


# -- the graph ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["default", "spectrumx_fig16", "parallel_links", "meta_ai_zone"])
def test_graph_from_a_spec_matches_the_emulated_fabric(name):
    spec = load_spec(name)
    graph, fabric = ClosGraph.from_spec(spec), Fabric(spec)
    assert sorted(graph.sw_name) == sorted(fabric.switches)
    assert graph.n_cables == len(fabric.links)
    fabric_labels = sorted(link.label for link in fabric.fabric_links)
    assert sorted(graph.link_label(2 * c) for c in graph.fabric_cables()) == fabric_labels
    ips = [graph.ip_text(graph.n_switches + i) for i in range(graph.n_ports)]
    assert ips == [p.ip for h in fabric.hosts.values() for p in h.ports]


def test_routes_match_the_controllers_next_hops_after_failures():
    spec = load_spec("parallel_links")
    graph, fabric = ClosGraph.from_spec(spec), Fabric(spec)
    failed = ["l1-s1", "l3-s2#2"]
    routes = Routes(graph, {cable(graph, label) for label in failed})
    by_label = {link.label: link for link in fabric.fabric_links}
    down = {by_label[label].key for label in failed}
    table = next_hops(fabric, down)
    for x in range(graph.n_switches):
        for leaf in graph.leaves:
            if x == leaf:
                continue
            ports = []
            for e in routes.options(x, leaf):
                link = by_label[graph.link_label(e)]
                ports.append(link.a_port if e % 2 == 0 else link.b_port)
            assert sorted(ports) == table[graph.sw_name[x]][graph.sw_name[leaf]]


def test_bad_parameters_are_one_line_errors():
    with pytest.raises(LabError, match="leaves must be a whole number >= 1"):
        ClosParams(leaves=0)
    with pytest.raises(LabError, match="need superspines"):
        ClosParams(pods=2)
    with pytest.raises(LabError, match="host_rate_mbps must be a finite number"):
        ClosParams(host_rate_mbps=float("inf"))


# -- ECMP, E-ECMP, QPs -------------------------------------------------------------------------------

def uplink_counts(graph, placed, leaf):
    counts = {e: 0 for links in graph.adj[leaf].values() for e in links}
    for route in placed.routes:
        first = placement.fabric_links(route)[:1]
        if first and first[0] in counts:
            counts[first[0]] += 1
    return counts


def test_ecmp_spreads_many_flows_nearly_uniformly_seed000():
    # Seed 000 section 4.1.1: about 1.2 max/mean flow count for 1000 flows hashed over 16 links.
    graph = ClosGraph(ClosParams(leaves=2, spines=16, hosts_per_leaf=10))
    pairs = [(i, 10 + j) for i in range(10) for j in range(10)]
    fl = flows.connection_flows(graph, pairs, 1e6, qps=10)
    assert len(fl) == 1000
    ratios = []
    for seed in range(8):
        counts = uplink_counts(graph, placement.place(graph, Routes(graph), fl, "ecmp", seed),
                               graph.leaf_id[1, 1]).values()
        assert sum(counts) == 1000 and min(counts) >= 35
        ratios.append(max(counts) / statistics.fmean(counts))
    assert 1.08 < statistics.fmean(ratios) < 1.4


def test_shared_source_ports_pin_all_qps_of_a_pair_and_eecmp_spreads_them_seed000():
    graph = ClosGraph(ClosParams(leaves=2, spines=8, hosts_per_leaf=1))
    routes = Routes(graph)
    shared = flows.connection_flows(graph, [(0, 1)], 1e6, qps=16, sport_mode="shared")
    assert len({f.sport for f in shared}) == 1
    paths = {tuple(placement.fabric_links(r)) for r in placement.place(graph, routes, shared, "ecmp").routes}
    assert len(paths) == 1                                   # no entropy: one path for 16 QPs
    paths = {tuple(placement.fabric_links(r)) for r in placement.place(graph, routes, shared, "eecmp").routes}
    assert len(paths) >= 5                                   # the destination QP spreads them
    per_qp = flows.connection_flows(graph, [(0, 1)], 1e6, qps=16, sport_mode="qp")
    assert len({f.sport for f in per_qp}) == 16
    paths = {tuple(placement.fabric_links(r)) for r in placement.place(graph, routes, per_qp, "ecmp").routes}
    assert len(paths) >= 5                                   # per-QP source ports spread them too


def test_shared_ports_slow_the_collective_and_eecmp_recovers():
    # 2 leaves x 8 spines, 8 hosts per leaf, leaf i's host k talks to leaf 2's host k over 8 QPs.
    graph = ClosGraph(ClosParams(leaves=2, spines=8, hosts_per_leaf=8, host_rate_mbps=10, fabric_rate_mbps=10))
    pairs = [(k, 8 + k) for k in range(8)]
    step = flows.Step("cross", flows.connection_flows(graph, pairs, MIB, qps=8, sport_mode="shared"))
    coll = flows.Collective("custom", MIB, 16, (step,))
    routes = Routes(graph)
    ecmp = evaluate.run(graph, routes, coll, "ecmp")
    eecmp = evaluate.run(graph, routes, coll, "eecmp")
    ideal = evaluate.run(graph, routes, coll, "ideal")
    # Roofline: every host sends 1 MiB at 10 Mbit/s = 0.8388608 s.
    assert ideal.cct_s == pytest.approx(MIB * 8 / 10e6)
    assert ecmp.cct_s >= 2 * ideal.cct_s - 1e-9       # whole pairs collide on an uplink
    assert eecmp.cct_s < ecmp.cct_s


def test_hash_is_deterministic_and_covers_the_qp_only_for_eecmp():
    graph = ClosGraph(ClosParams(leaves=2, spines=4, hosts_per_leaf=1))
    a, b = flows.connection_flows(graph, [(0, 1)], 1e6, qps=2, sport_mode="shared")
    assert placement.flow_hash(graph, a) == placement.flow_hash(graph, b)
    assert placement.flow_hash(graph, a, with_qp=True) != placement.flow_hash(graph, b, with_qp=True)
    first = placement.place(graph, Routes(graph), [a, b], "eecmp").routes
    assert placement.place(graph, Routes(graph), [a, b], "eecmp").routes == first


# -- TE, spray, ideal ----------------------------------------------------------------------------------

def test_te_puts_each_flow_on_its_own_uplink():
    graph = ClosGraph(ClosParams(leaves=2, spines=4, hosts_per_leaf=4))
    fl = flows.connection_flows(graph, [(k, 4 + k) for k in range(4)], 1e6)
    placed = placement.place(graph, Routes(graph), fl, "te")
    assert sorted(uplink_counts(graph, placed, graph.leaf_id[1, 1]).values()) == [1, 1, 1, 1]
    assert placed.unsatisfied == 0
    assert max_min_rates(graph.link_cap, placed.routes) == pytest.approx([10.0] * 4)


def test_te_counts_flows_it_cannot_satisfy():
    # 2:1 oversubscribed: 4 hosts x 10 up, 2 uplinks x 10. Two of four 10 Mbit/s demands fit.
    graph = ClosGraph(ClosParams(leaves=2, spines=2, hosts_per_leaf=4))
    fl = flows.connection_flows(graph, [(k, 4 + k) for k in range(4)], 1e6)
    assert placement.place(graph, Routes(graph), fl, "te").unsatisfied == 2


def test_ideal_weights_by_remaining_capacity_and_spray_does_not():
    # 2 leaves x 2 spines x 2 parallel links, 4 hosts per leaf, 10 Mbit/s; l2-s1 loses a member.
    # l1 -> l2 capacity: via s1 min(20, 10) + via s2 min(20, 20) = 30 for 4 flows of 10.
    # ideal sends 1/3 via s1, 2/3 via s2: all links full at 7.5 per flow (30 in total).
    # spray sends 1/2 via s1, whose single link to l2 (10) caps the total at 20: 5 per flow.
    graph = ClosGraph(ClosParams(leaves=2, spines=2, hosts_per_leaf=4, parallel_links=2))
    routes = Routes(graph, {cable(graph, "l2-s1")})
    fl = flows.connection_flows(graph, [(k, 4 + k) for k in range(4)], 1e6)
    rates = {s: max_min_rates(graph.link_cap, placement.place(graph, routes, fl, s).routes)
             for s in ("spray", "ideal", "te")}
    assert rates["ideal"] == pytest.approx([7.5] * 4)
    assert rates["spray"] == pytest.approx([5.0] * 4)
    assert sum(rates["te"]) == pytest.approx(30.0)


def test_adaptive_routing_is_predicted_by_the_capacity_weighted_split_and_keeps_its_name():
    # The same degraded fabric as above: AR sends each packet to the shortest queue, weighted by
    # the capacity behind each member; in the fluid limit that is `ideal`.
    graph = ClosGraph(ClosParams(leaves=2, spines=2, hosts_per_leaf=4, parallel_links=2))
    routes = Routes(graph, {cable(graph, "l2-s1")})
    fl = flows.connection_flows(graph, [(k, 4 + k) for k in range(4)], 1e6)
    ar = placement.place(graph, routes, fl, "ar")
    assert ar.scheme == "ar" and ar.routes == placement.place(graph, routes, fl, "ideal").routes
    assert max_min_rates(graph.link_cap, ar.routes) == pytest.approx([7.5] * 4)


def test_unknown_scheme_is_refused():
    graph = ClosGraph(ClosParams())
    with pytest.raises(LabError, match="routing must be one of"):
        placement.place(graph, Routes(graph), [], "random")


# -- collectives, step by step -------------------------------------------------------------------------

def test_ring_allreduce_on_tiny_by_hand():
    # 2 hosts: 2(p-1) = 2 steps, each host sends size/2 = 512 KiB at 10 Mbit/s: 0.4194304 s a step.
    graph = ClosGraph.from_spec(load_spec("tiny"))
    coll = flows.ring_allreduce(graph, MIB)
    assert coll.steps[0].repeat == 2 and len(coll.steps[0].flows) == 2
    for scheme in placement.SCHEMES:
        out = evaluate.run(graph, Routes(graph), coll, scheme)
        assert out.cct_s == pytest.approx(2 * MIB / 2 * 8 / 10e6)
        assert out.busbw_Bps * 8 / 1e6 == pytest.approx(10.0)        # busbw = link rate


def test_alltoall_with_an_uplink_bottleneck_by_hand():
    # 2 leaves, 1 spine, 2 hosts per leaf, 10 Mbit/s. Each host sends 1 MiB / 4 to each of 3 peers.
    # Leaf uplink carries 4 cross-leaf flows: 2.5 each; the intra-leaf flow gets 10 - 2 x 2.5 = 5.
    # The step lasts 256 KiB / 2.5 Mbit/s = 0.8388608 s; busbw = 1 MiB / T x 3/4.
    graph = ClosGraph(ClosParams(leaves=2, spines=1, hosts_per_leaf=2))
    coll = flows.alltoall(graph, MIB)
    out = evaluate.run(graph, Routes(graph), coll, "ecmp")
    assert sorted(set(round(r, 9) for r in out.rates)) == [2.5, 5.0]
    assert out.cct_s == pytest.approx(MIB / 4 * 8 / 2.5e6)
    assert out.busbw_Bps == pytest.approx(MIB / out.cct_s * 3 / 4)


def test_alltoall_on_the_oversubscribed_spec_by_hand():
    # 4 leaves x 2 spines, 4 hosts per leaf, 10 Mbit/s. A leaf sends 4 x 12 cross-leaf flows over
    # 2 uplinks (20): split evenly, 24 flows' worth per uplink -> 10/24 Mbit/s each. A step moves
    # 1 MiB / 16 per flow: 65536 x 8 / (10/24 x 1e6) = 1.2582912 s.
    graph = ClosGraph.from_spec(load_spec("oversubscribed"))
    out = evaluate.run(graph, Routes(graph), flows.alltoall(graph, MIB), "ideal")
    assert out.cct_s == pytest.approx(MIB / 16 * 8 / (10 / 24 * 1e6))
    assert min(out.rates) == pytest.approx(10 / 24)


def test_qps_split_a_connection_and_keep_the_total():
    graph = ClosGraph.from_spec(load_spec("spectrumx_fig16"))
    coll = flows.ring_allreduce(graph, MIB, qps=4)
    fl = coll.steps[0].flows
    assert len(fl) == 12 * 4 * 4                 # 12 connections x 4 rails (planes) x 4 QPs
    assert sum(f.nbytes for f in fl) == pytest.approx(MIB)      # 12 ranks x size/12
    assert {graph.port_plane[f.src - graph.n_switches] for f in fl} == {1, 2, 3, 4}
    assert all(graph.port_plane[f.src - graph.n_switches] == graph.port_plane[f.dst - graph.n_switches]
               for f in fl)


def test_balance_reports_the_emulations_max_mean():
    graph = ClosGraph(ClosParams(leaves=2, spines=2, hosts_per_leaf=1))
    routes = Routes(graph)
    out = evaluate.run(graph, routes, flows.ring_allreduce(graph, MIB), "ecmp")
    bal = evaluate.balance(graph, routes, out.loads)
    # One flow each way: each leaf sends 10 up one of its 2 uplinks; 2 of 4 up links carry 10,
    # mean 5 -> max/mean 2 (and 1 over the loaded links only).
    assert bal["up"]["links"] == 4 and bal["up"]["max_mean"] == pytest.approx(2.0)
    assert bal["up"]["max_mean_loaded"] == pytest.approx(1.0)
    spread = evaluate.balance(graph, routes, evaluate.run(graph, routes, flows.ring_allreduce(graph, MIB),
                                                          "spray").loads)
    assert spread["up"]["max_mean"] == pytest.approx(1.0)


def test_workload_limits_are_one_line_errors():
    graph = ClosGraph.from_spec(load_spec("default"))
    with pytest.raises(LabError, match="more than --max-flows 10"):
        flows.alltoall(graph, MIB, max_flows=10)
    with pytest.raises(LabError, match="message size"):
        flows.ring_allreduce(graph, 0)
    with pytest.raises(LabError, match="QPs per connection"):
        flows.ring_allreduce(graph, MIB, qps=0)
    with pytest.raises(LabError, match="one host"):
        flows.ring_allreduce(ClosGraph(ClosParams(leaves=1, hosts_per_leaf=1)), MIB)


# -- command line ----------------------------------------------------------------------------------------

def test_fabric_command_json_records_the_scale(capsys, tmp_path):
    assert main(["model", "fabric", "tiny", "--size", "1M", "--routing", "ecmp,ideal",
                 "--format", "json", "--out", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "model" and doc["model"] == "fabric"
    assert doc["scale"]["time_scale"] == pytest.approx(40000)
    assert doc["scale"]["buffers_bytes"] == {"host": 65536, "leaf": 65536, "spine": 262144}
    assert doc["scale"]["host_rate_mbps"] == 10 and doc["spec"]["name"] == "tiny"
    assert [r["routing"] for r in doc["results"]] == ["ecmp", "ideal"]
    assert doc["results"][0]["cct_s"] == pytest.approx(0.8388608)
    assert doc["results"][0]["cct_real_s"] == pytest.approx(0.8388608 / 40000)
    assert json.loads((tmp_path / "results.json").read_text())["results"] == doc["results"]


def test_fabric_command_table_and_three_tier(capsys):
    assert main(["model", "fabric", "default", "--collective", "alltoall", "--size", "1M",
                 "--qps", "4", "--sport-mode", "shared", "--links", "3"]) == 0
    out = capsys.readouterr().out
    assert "eecmp" in out and "Busiest fabric links, te" in out
    assert main(["model", "fabric", "default", "--pods", "2", "--superspines", "2", "--size", "1M",
                 "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fabric"]["tiers"] == 3 and doc["fabric"]["hosts"] == 16


@pytest.mark.parametrize("argv, message", [
    (["model", "fabric", "tiny", "--routing", "ecmp,magic"], "unknown routing 'magic'"),
    (["model", "fabric", "tiny", "--pods", "2"], "need superspines"),
    (["model", "fabric", "tiny", "--size", "1M,2M"], "one message size"),
    (["model", "fabric", "nope"], "no spec file 'nope'"),
    (["model", "fabric", "tiny", "--core-rate", "fast"], "--core-rate"),
    (["model", "failures", "tiny", "--fraction", "1.5"], "fraction must be in [0, 1)"),
    (["model", "failures", "tiny", "--trials", "0"], "--trials must be >= 1"),
    (["model", "benchmark", "--sizes", "4x0x2"], "bad size '4x0x2'"),
])
def test_bad_input_is_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


def test_the_python_example_in_docs_model_md_runs(capsys):
    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "model.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/model.md", "exec"), {})
    assert "CCT" in capsys.readouterr().out


def test_calibration_refuses_what_the_model_ranks_differently():
    from fabriclab.errors import LabError
    from fabriclab.workflows.calibrate import check_calibratable
    from fabriclab.topologies.spec import load_spec

    check_calibratable(load_spec("default"))
    with pytest.raises(LabError, match="one NIC per host on one plane"):
        check_calibratable(load_spec("meta_ai_zone"))
    with pytest.raises(LabError, match="4 plane"):
        check_calibratable(load_spec("spectrumx_fig16"))


def test_calibration_error_is_relative_to_the_emulation():
    from fabriclab.workflows.calibrate import compare

    emulated = [{"size": 1024, "cct_ms": {"mean": 200.0}, "busbw_mbps": 10.0, "valid": True,
                 "balance": {"up": {"max_mean_ratio": 2.0}}}]
    modelled = {(1024, "ecmp"): {"cct_s": 0.18, "uplink_max_mean": 4.0},
                (1024, "ideal"): {"cct_s": 0.15, "uplink_max_mean": 1.0}}
    (row,) = compare(emulated, modelled)
    assert row["ecmp_error"] == pytest.approx(-0.1) and row["ideal_error"] == pytest.approx(-0.25)
    assert row["ecmp_uplink_max_mean"] == 4.0 and row["emulated_uplink_max_mean"] == 2.0
