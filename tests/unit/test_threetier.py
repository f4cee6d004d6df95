"""The threetier spec kind without a network: the spec and its refusals, the fabric's names, ports
and addresses, up-down paths, routing on the fake switches, the flow model's agreement, the
drawing, and zone-aware rank placement with its cross-zone bytes."""

import dataclasses
import types

import pytest

from fabriclab.apps.control import AppConfig, RunFiles
from fabriclab.apps.core import ControllerCore
from fabriclab.apps.ecmp import EcmpRouting
from fabriclab.apps.paths import all_paths, path_nodes
from fabriclab.apps.te import TeRouting
from fabriclab.errors import SpecError
from fabriclab.measure import zones
from fabriclab.model.graph import ClosGraph, ClosParams
from fabriclab.queues.config import QueueSpec
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import FabricSpec, load_spec, spec_from_dict
from fabriclab.traffic import schedules
from fabriclab.traffic.collective import CollectiveSpec, place_ranks
from fabriclab.view import layout
from tests.unit.fakeoftable import FakeFabric


def three(**changes):
    base = dict(name="t3", kind="threetier", pods=3, leaves=2, spines=2, super_spines=4, hosts_per_leaf=2,
                host_rate_mbps=20, fabric_rate_mbps=20, super_spine_rate_mbps=10)
    return FabricSpec(**{**base, **changes})


@pytest.fixture(scope="module")
def meta_dc():
    return Fabric(load_spec("meta_dc"))


@pytest.fixture(scope="module")
def t3():
    return Fabric(three())


# -- the spec ---------------------------------------------------------------------------------------
def test_the_shipped_spec_reads_and_reports_its_cross_zone_oversubscription(meta_dc):
    spec = meta_dc.spec
    assert (spec.kind, spec.pods, spec.leaves, spec.spines, spec.super_spines) == ("threetier", 2, 2, 2, 2)
    assert spec.core_rate_mbps == 10 and spec.oversubscription == 1.0
    assert spec.cross_zone_oversubscription == 4.0          # a spine: 2 x 20 down, 1 x 10 up
    summary = meta_dc.summary()
    assert summary["cross_zone_oversubscription"] == 4.0 and summary["pods"] == 2
    assert summary["buffers_bytes"]["super_spine"] == 256 * 1024
    assert (summary["switches"], summary["hosts"], summary["links"]) == (10, 8, 20)


def test_a_two_tier_spec_keeps_its_results_shape():
    spec = load_spec("default")
    assert spec.cross_zone_oversubscription is None
    assert set(spec.to_dict()["buffers"]) == {"host", "leaf", "spine"}
    assert set(Fabric(spec).summary()["buffers_bytes"]) == {"host", "leaf", "spine"}
    assert "cross_zone_oversubscription" not in Fabric(spec).summary()


def test_a_spec_round_trips_through_its_results_record(t3):
    again = Fabric.from_spec_dict(t3.spec.to_dict())
    assert again.spec == t3.spec and [k.key for k in again.links] == [k.key for k in t3.links]


def test_yaml_fields():
    spec = spec_from_dict({"name": "y", "kind": "threetier", "pods": 2, "super_spines": 4,
                           "super_spine_rate": "5Mbit", "buffers": {"super_spine": "2MiB"}})
    assert spec.super_spine_rate_mbps == 5 and spec.buffers.super_spine == 2 << 20
    assert spec.core_rate_mbps == 5
    assert three(super_spine_rate_mbps=None).core_rate_mbps == 20      # default: fabric_rate


@pytest.mark.parametrize("changes, words", [
    (dict(pods=1), "pods must be >= 2 for kind threetier"),
    (dict(super_spines=0), "super_spines must be >= 1 for kind threetier"),
    (dict(super_spines=3), "super_spines (3) must be a multiple of spines (2)"),
    (dict(planes=2), "planes must be 1 for kind threetier"),
    (dict(pods=64, leaves=4), "pods x leaves is 256, at most 254"),
    (dict(pods=65), "pods must be <= 64"),
    (dict(super_spine_rate_mbps=0), "super_spine_rate must be > 0"),
    (dict(super_spine_rate_mbps=float("inf")), "super_spine_rate must be finite"),
    (dict(pods=True), "pods must be a whole number"),
])
def test_nonsense_is_refused_in_one_line(changes, words):
    with pytest.raises(SpecError) as err:
        three(**changes)
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("changes, words", [
    (dict(pods=2), "pods must be 1 for kind 'leafspine' (use kind threetier)"),
    (dict(super_spines=2), "super_spines is for kind threetier"),
    (dict(super_spine_rate_mbps=10.0), "super_spine_rate is for kind threetier"),
])
def test_the_tier_fields_belong_to_threetier(changes, words):
    with pytest.raises(SpecError, match=words.replace("(", r"\(").replace(")", r"\)")):
        FabricSpec(name="two", **changes)


def test_a_super_spine_buffer_on_a_two_tier_spec_is_refused():
    with pytest.raises(SpecError, match="buffers.super_spine is for kind threetier"):
        spec_from_dict({"name": "two", "buffers": {"super_spine": "1MiB"}})


def test_the_queue_model_checks_the_super_spine_buffer():
    assert three(queues=QueueSpec()).queues is not None
    tiny_top = dataclasses.replace(three().buffers, super_spine=20_000)
    with pytest.raises(SpecError, match="super_spine"):
        three(queues=QueueSpec(), buffers=tiny_top)


# -- the fabric -------------------------------------------------------------------------------------
def test_names_dpids_and_pods(t3):
    roles = {}
    for s in t3.switches.values():
        roles.setdefault(s.role, []).append(s.name)
    assert roles == {"leaf": [f"l{i}" for i in range(1, 7)], "spine": [f"s{i}" for i in range(1, 7)],
                     "super_spine": ["ss1", "ss2", "ss3", "ss4"]}
    assert len({s.dpid for s in t3.switches.values()}) == 16
    assert [t3.pod_of(n) for n in ("l1", "l2", "l3", "s3", "s4", "s5", "ss1", "h1", "h5", "h12")] == \
        [1, 1, 2, 2, 2, 3, 0, 1, 2, 3]
    assert t3.switches["ss4"].tier == 2


def test_spine_k_of_every_pod_joins_the_super_spines_of_group_k(t3):
    up = {}
    for link in t3.core_links:
        up.setdefault(link.a, []).append((link.b, link.a_port, link.b_port, link.rate_mbps))
    # group size 2: spine 1 of a pod -> ss1, ss2; spine 2 -> ss3, ss4; a super-spine's port p faces pod p
    assert up["s1"] == [("ss1", 3, 1, 10), ("ss2", 4, 1, 10)]
    assert up["s4"] == [("ss3", 3, 2, 10), ("ss4", 4, 2, 10)]
    assert up["s5"] == [("ss1", 3, 3, 10), ("ss2", 4, 3, 10)]
    # a pod's spines face only that pod's leaves, on ports 1..leaves (by the leaf's place in its pod)
    assert sorted((link.a, link.b_port) for link in t3.fabric_links if link.b == "s3") == [("l3", 1), ("l4", 2)]


def test_every_switch_numbers_its_ports_from_one_without_gaps(t3):
    for name in t3.switches:
        ports = list(t3.switch_ports(name))
        assert ports == list(range(1, len(ports) + 1)), name


def test_addresses_number_leaves_across_pods(t3):
    ips = [p.ip for h in t3.hosts.values() for p in h.ports]
    assert len(set(ips)) == len(ips) == 12
    assert t3.hosts["h5"].ports[0].ip == "10.1.3.1" and t3.hosts["h12"].ports[0].ip == "10.1.6.2"


# -- paths ------------------------------------------------------------------------------------------
def _up_down(fabric, nodes):
    tiers = [fabric.switches[n].tier for n in nodes]
    peak = tiers.index(max(tiers))
    return all(a < b for a, b in zip(tiers[:peak + 1], tiers[1:peak + 1])) and \
        all(a > b for a, b in zip(tiers[peak:], tiers[peak + 1:]))


def test_shortest_paths_are_up_down_through_the_tier_they_need(t3):
    leaves = [s.name for s in t3.leaves()]
    for src in leaves:
        for dst in leaves:
            if src == dst:
                continue
            paths = [path_nodes(p, src) for p in all_paths(t3, src, dst)]
            assert paths and all(_up_down(t3, nodes) for nodes in paths)
            if t3.pod_of(src) == t3.pod_of(dst):
                assert len(paths) == 2 and all(len(n) == 3 for n in paths)        # via each spine
            else:
                assert len(paths) == 4 and all(len(n) == 5 for n in paths)        # spine x its group


def _program(fabric, routing):
    core = ControllerCore(AppConfig(routing.name, {}, fabric, RunFiles("/nonexistent"), "run-1"), routing)
    fake = FakeFabric(fabric)
    fake.connect(core)
    assert core.programmed
    return fake


@pytest.mark.parametrize("routing_class", [EcmpRouting, TeRouting])
def test_every_host_reaches_every_other_over_up_down_paths(t3, routing_class):
    fake = _program(t3, routing_class(t3))
    ports = [p for h in t3.hosts.values() for p in h.ports]
    for src in ports:
        for dst in ports:
            if src is dst:
                continue
            scenarios = fake.trace(src, fake.packet(src, dst.ip, eth_type=0x0800, ip_proto=17,
                                                    udp_src=49152, udp_dst=4791))
            for scenario in scenarios:
                (delivery,) = scenario
                assert delivery.kind == "host" and delivery.where == dst.intf, (src.intf, dst.intf, delivery)
                assert _up_down(t3, delivery.switches)
                crossed = any(t3.switches[s].role == "super_spine" for s in delivery.switches)
                assert crossed == zones.crosses(t3, src.host, dst.host)


def test_a_super_spine_down_leaves_every_zone_reachable(t3):
    routing = EcmpRouting(t3)
    down = frozenset(link.key for link in t3.core_links if link.b == "ss1")
    hops = routing.desired(down)
    assert hops and all(all_paths(t3, "l1", leaf.name, down) for leaf in t3.leaves() if leaf.name != "l1")


def test_weighted_ecmp_sees_a_super_spine_link_lost_two_tiers_up(t3):
    from fabriclab.apps.ecmp import WeightedGroup, group_id

    down = frozenset(link.key for link in t3.core_links if (link.a, link.b) == ("s1", "ss1"))
    states = EcmpRouting(t3, weighted=True).desired(down)
    # l1's uplinks: port 3 to s1 (one of its two super-spine links left), port 4 to s2 (both)
    assert states["l1"].groups[group_id(t3.switches["l3"])] == WeightedGroup((3, 4), (1, 2))
    assert states["l1"].groups[group_id(t3.switches["l2"])] == (3, 4)      # inside the zone: even


# -- the flow model agrees --------------------------------------------------------------------------
def test_the_flow_model_builds_the_same_fabric(t3):
    params = ClosParams.from_spec(t3.spec)
    assert (params.pods, params.superspines, params.core_rate) == (3, 2, 10)
    graph = ClosGraph(params, t3.spec)
    assert sorted(graph.sw_name) == sorted(t3.switches)
    model_cables = {tuple(sorted((graph.sw_name[graph.link_src[e]], graph.sw_name[graph.link_dst[e]])))
                    for e in range(2 * graph.n_ports, graph.n_links)}
    assert model_cables == {tuple(sorted((k.a, k.b))) for k in t3.fabric_links}


# -- drawing ----------------------------------------------------------------------------------------
def test_the_drawing_puts_the_super_spines_on_top(t3):
    lay = layout.layout(t3)
    y = {n["role"]: n["y"] for n in lay["nodes"]}
    assert y["super_spine"] < y["spine"] < y["leaf"] < y["host"] < lay["height"]
    assert all(0 < n["x"] < lay["width"] for n in lay["nodes"])


# -- placement and cross-zone bytes -----------------------------------------------------------------
def _ring(fabric, placement):
    ranks = place_ranks(fabric, CollectiveSpec(placement=placement))
    hosts = [r.host for r in ranks]
    schedule = schedules.build("allreduce", len(ranks), 1 << 20)
    return hosts, zones.schedule_bytes(fabric, hosts, schedule.transfers)


def test_topology_placement_keeps_ring_neighbours_in_a_zone(meta_dc):
    hosts, (cross, total) = _ring(meta_dc, "topology")
    assert [meta_dc.pod_of(h) for h in hosts] == [1, 1, 1, 1, 2, 2, 2, 2]
    # a ring AllReduce of 8 ranks: every rank sends 2 x 7/8 of the size to its successor;
    # two of the eight ring hops cross between the zones
    assert cross * 4 == total


def test_scatter_puts_every_ring_neighbour_in_another_zone(meta_dc):
    hosts, (cross, total) = _ring(meta_dc, "scatter")
    assert [meta_dc.pod_of(h) for h in hosts] == [1, 2, 1, 2, 1, 2, 1, 2]
    assert hosts[:3] == ["h1", "h5", "h2"]
    assert cross == total


def test_topology_sorts_a_host_list_given_out_of_order_by_zone(t3):
    ranks = place_ranks(t3, CollectiveSpec(placement="topology", hosts=("h9", "h1", "h5", "h2")))
    assert [r.host for r in ranks] == ["h1", "h2", "h5", "h9"]


def test_scatter_on_a_two_tier_fabric_deals_over_leaves():
    fabric = Fabric(load_spec("default"))
    ranks = place_ranks(fabric, CollectiveSpec(placement="scatter"))
    assert [r.host for r in ranks] == ["h1", "h3", "h5", "h7", "h2", "h4", "h6", "h8"]


def test_the_record_counts_the_schedule_and_the_super_spine_counters(meta_dc):
    hosts = ["h1", "h2", "h5", "h6"]
    transfers = [types.SimpleNamespace(src=0, dst=1, nbytes=100), types.SimpleNamespace(src=1, dst=2, nbytes=40),
                 types.SimpleNamespace(src=3, dst=0, nbytes=60), types.SimpleNamespace(src=2, dst=2, nbytes=999)]
    intfs = [link.a_intf for link in meta_dc.core_links]
    assert intfs == ["s1-eth3", "s2-eth3", "s3-eth3", "s4-eth3"]
    before = {"counters": {i: {"tx_bytes": 1000} for i in intfs}}
    after = {"counters": {i: {"tx_bytes": 1000 + 50 * n} for n, i in enumerate(intfs)}}
    rec = zones.record(meta_dc, hosts, transfers, 3, (before, after))
    assert rec == {"schedule_bytes": 300, "share": 0.5, "counted_bytes": 300, "ring_hops_across": 2,
                   "zones": [1, 2]}
    del after["counters"]["s2-eth3"]
    assert zones.counted_bytes(meta_dc, before, after) is None
    assert zones.record(Fabric(load_spec("default")), ["h1", "h2"], transfers[:1], 1, (before, after)) is None


def test_a_scenario_job_takes_the_placement_and_refuses_an_unknown_one():
    from fabriclab.errors import LabError
    from fabriclab.workflows import scenario

    def job(placement):
        return {"name": "zones", "spec": "meta_dc", "routing": "ecmp",
                "jobs": [{"name": "ring", "collective": "allreduce", "sizes": ["256K"], "placement": placement}]}

    parsed = scenario.parse(job("scatter"))
    assert parsed.jobs[0].spec.placement == "scatter"
    with pytest.raises(LabError, match="placement must be one of order, topology, scatter, random, rail, got 'zone'"):
        scenario.parse(job("zone"))


def test_cross_zone_bytes_follow_the_schema_and_show_in_the_tables():
    from fabriclab.results import document, tables
    from tests.unit import resultdocs as rd

    job = rd.collective_job(10.0, hosts=("h1", "h2", "h3", "h4"), spec="meta_dc")
    for row, (sched, wire) in zip(job["sizes"], ((2_752_512, 2_798_896), (11_010_048, None))):
        row["cross_zone"] = {"schedule_bytes": sched, "share": 0.25, "counted_bytes": wire,
                             "ring_hops_across": 2, "zones": [1, 2]}
    doc = rd.doc("collective", [rd.run("ecmp", {"allreduce": job})])
    assert document.first_problem(doc) is None
    table = tables.collective_table(doc)
    assert "cross-zone MiB sched/wire" in table
    assert "2.6/2.7" in table and "10.5/?" in table         # a missing counter is shown, not guessed
    assert "cross-zone 2.6/2.7 MiB" in tables.runs_table(doc)
    job["sizes"][0]["cross_zone"]["share"] = 1.5                   # a share is at most 1
    assert "runs/0/jobs/allreduce" in document.first_problem(doc)
