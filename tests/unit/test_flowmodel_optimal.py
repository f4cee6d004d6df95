"""The optimal placement (min-congestion LP): closed-form cases, an uneven optimum after a
failure, and the bound it must be for every other scheme."""

import pytest

from fabriclab.cli.main import main
from fabriclab.errors import LabError
from fabriclab.model import evaluate, flows, optimal, placement
from fabriclab.model.graph import ClosGraph, ClosParams
from fabriclab.model.optimal import congestion
from fabriclab.model.routes import Routes
from tests.unit.flowmodel_cases import cases

MIB = 2**20


def cable(graph, label):
    (found,) = [c for c in graph.fabric_cables() if graph.link_label(2 * c) == label]
    return found


def share_on(route, link):
    return sum(share for e, share in route if e == link)


def test_two_leaves_two_spines_by_hand():
    # h1, h2 on l1 send to h3, h4 on l2: 2 x 10 Mbit/s of demand over l1's two 10 Mbit/s
    # uplinks: the optimum fills both exactly (1.0). With l1-s1 down, 20 over 10: 2.0, and
    # the two flows share l1-s2 at 5 each.
    graph = ClosGraph(ClosParams(leaves=2, spines=2, hosts_per_leaf=2))
    fl = flows.connection_flows(graph, [(0, 2), (1, 3)], MIB)
    placed = placement.place(graph, Routes(graph), fl, "optimal")
    assert placed.congestion == pytest.approx(1.0, rel=1e-7)
    down = Routes(graph, {cable(graph, "l1-s1")})
    placed = placement.place(graph, down, fl, "optimal")
    assert placed.congestion == pytest.approx(2.0, rel=1e-7)
    from fabriclab.model.maxmin import max_min_rates
    assert max_min_rates(graph.link_cap, placed.routes) == pytest.approx([5.0, 5.0], rel=1e-7)
    # slower fabric links: the same demand over 2 x 5 Mbit/s is twice the utilisation
    slow = ClosGraph(ClosParams(leaves=2, spines=2, hosts_per_leaf=2, fabric_rate_mbps=5.0))
    fl = flows.connection_flows(slow, [(0, 2), (1, 3)], MIB)
    assert placement.place(slow, Routes(slow), fl, "optimal").congestion == pytest.approx(2.0, rel=1e-7)


def test_a_failure_makes_the_optimum_uneven():
    # h1 (l1) -> h3 (l2) and h5 (l3) -> h4 (l2), 10 Mbit/s each, l1-s1 down. l1's flow must go through s2, so
    # s2-l2 carries 10 from it; the optimum sends all of l3's flow through s1 (utilisation
    # 1.0). Splitting l3's evenly, as spray and ideal do, puts 15 on s2-l2: 1.5.
    graph = ClosGraph(ClosParams(leaves=3, spines=2, hosts_per_leaf=2))
    routes = Routes(graph, {cable(graph, "l1-s1")})
    fl = flows.connection_flows(graph, [(0, 2), (4, 3)], MIB)
    placed = placement.place(graph, routes, fl, "optimal")
    assert placed.congestion == pytest.approx(1.0, rel=1e-7)
    l3s1, l3s2 = 2 * cable(graph, "l3-s1"), 2 * cable(graph, "l3-s2")
    assert share_on(placed.routes[1], l3s1) == pytest.approx(1.0, abs=1e-6)
    assert share_on(placed.routes[1], l3s2) == pytest.approx(0.0, abs=1e-6)
    for scheme in ("spray", "ideal"):
        assert congestion(graph, fl, placement.place(graph, routes, fl, scheme)) == pytest.approx(1.5)


@pytest.mark.parametrize("name,graph,collective,down,hash_seed",
                         [c for c in cases() if not c[0].startswith("medium")], ids=lambda v: str(v)[:30])
def test_the_bound_is_never_above_any_other_scheme(name, graph, collective, down, hash_seed):
    routes = Routes(graph, down)
    step = collective.steps[0].flows
    best = placement.place(graph, routes, step, "optimal")
    assert congestion(graph, step, best) == pytest.approx(best.congestion, rel=1e-6, abs=1e-9)
    for scheme in ("ecmp", "eecmp", "te", "spray", "ideal"):
        other = congestion(graph, step, placement.place(graph, routes, step, scheme, hash_seed))
        assert best.congestion <= other * (1 + 1e-7) + 1e-9, (name, scheme)


def test_greedy_te_is_twice_the_optimum_on_a_shuffled_ring():
    # The finding at 4K-256K endpoints, on 256: every flow demands its NIC's rate, and
    # CSPF pins flows whole, so some spine-leaf links carry two: half rate, twice the CCT.
    graph = ClosGraph(ClosParams(leaves=32, spines=8, hosts_per_leaf=8))
    ring = flows.ring_allreduce(graph, 2**26, order="shuffled", seed=0)
    routes = Routes(graph)
    te, best = (evaluate.run(graph, routes, ring, s) for s in ("te", "optimal"))
    assert te.cct_s / best.cct_s == pytest.approx(2.0, rel=1e-6)
    assert best.bound == pytest.approx(1.0, rel=1e-7)


def test_past_the_size_limit_is_one_line(monkeypatch):
    monkeypatch.setattr(optimal, "MAX_VARIABLES", 10)
    graph = ClosGraph(ClosParams(leaves=4, spines=4, hosts_per_leaf=2))
    with pytest.raises(LabError) as err:
        placement.place(graph, Routes(graph), flows.alltoall(graph, MIB).steps[0].flows, "optimal")
    assert "optimal" in str(err.value) and "\n" not in str(err.value)


def test_fabric_command_reports_te_against_the_optimum(capsys):
    assert main(["model", "fabric", "default", "--routing", "te,optimal", "--order", "shuffled"]) == 0
    out = capsys.readouterr().out
    assert "optimal" in out and "TE's CCT" in out


def test_default_routing_leaves_out_an_lp_too_big_and_says_so(monkeypatch, capsys):
    monkeypatch.setattr(optimal, "MAX_VARIABLES", 10)
    assert main(["model", "fabric", "default", "--format", "json"]) == 0
    import json
    doc = json.loads(capsys.readouterr().out)
    assert [r["routing"] for r in doc["results"]] == [s for s in placement.SCHEMES if s != "optimal"]
    assert any(n.startswith("optimal left out: optimal: the placement's LP") for n in doc["notes"])
    # asked for by name, it is an error: one line, exit status 2
    assert main(["model", "fabric", "default", "--routing", "optimal"]) == 2
    err = capsys.readouterr().err.strip()
    assert "optimal: the placement's LP would have more than 10" in err and "\n" not in err
