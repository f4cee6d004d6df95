"""Each switch hashes from a basis of its own (apps/hashing.py), without a network: the select
groups carry it, one basis everywhere polarizes a three-tier fabric's second tier while per-switch
bases spread it as random hashing would, and the flow model chooses as the switches do (OVS's
groups on the fake switches, the stage's E-ECMP through its Python twin) at every tier."""

import random
import statistics

import pytest

from fabriclab.apps.control import AppConfig, RunFiles
from fabriclab.apps.core import ControllerCore
from fabriclab.apps.ecmp import EcmpRouting, group_id
from fabriclab.apps.hashing import eecmp_member, switch_basis, switch_bases
from fabriclab.model import flows as model_flows
from fabriclab.model import placement
from fabriclab.model.graph import ClosGraph
from fabriclab.model.routes import Routes
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import FabricSpec
from tests.unit.fakeoftable import FakeFabric
from tests.unit.routings import parsed

# The shape: 2 zones of 2 leaves x 2 spines, 4 super-spines (each spine has 2 uplinks)
SPEC = FabricSpec(name="t-tiers", kind="threetier", pods=2, leaves=2, spines=2, super_spines=4, hosts_per_leaf=4,
                  host_rate_mbps=10, fabric_rate_mbps=10, super_spine_rate_mbps=10)
QPS = 4


@pytest.fixture(scope="module")
def fabric():
    return Fabric(SPEC)


def program(fabric, routing="ecmp"):
    _name, options = parsed(routing)
    core = ControllerCore(AppConfig("ecmp", options, fabric, RunFiles("/nonexistent"), "run-1"), EcmpRouting(fabric))
    fake = FakeFabric(fabric)
    fake.connect(core)
    assert core.programmed
    return fake


def cross_zone_flows(fabric):
    """(source port, destination port, UDP source port) of QPS flows per host pair across zones."""
    ports = [p for h in fabric.hosts.values() for p in h.ports]
    pod = {s.name: s.pod for s in fabric.switches.values()}
    return [(a, b, 49152 + 7 * q + i) for i, (a, b) in enumerate((a, b) for a in ports for b in ports
                                                                   if pod[a.leaf] != pod[b.leaf]) for q in range(QPS)]


def uplink_counts(fabric, fake, flows):
    """Flows per spine->super-spine cable, every such cable listed (0 where none went)."""
    counts = {(k.a, k.b): 0 for k in fabric.core_links}
    for src, dst, sport in flows:
        (delivery,) = fake.route(src, fake.packet(src, dst.ip, eth_type=0x0800, ip_proto=17, udp_src=sport,
                                                  udp_dst=4791))
        assert delivery.kind == "host" and delivery.where == dst.intf
        hops = delivery.switches
        for a, b in zip(hops, hops[1:]):
            if (a, b) in counts:
                counts[a, b] += 1
    return counts


def max_mean(values):
    return max(values) / statistics.fmean(values)


def test_every_switch_has_a_basis_of_its_own_and_one_shared_only_when_asked(fabric):
    bases = switch_bases(fabric, {"seed": 0})
    assert len(set(bases.values())) == len(fabric.switches)
    assert switch_bases(fabric, {"seed": 0}) == bases                         # a seed repeats
    assert set(switch_bases(fabric, {"seed": 1}).values()).isdisjoint(bases.values())
    shared = switch_bases(fabric, {"seed": 0, "shared_basis": True})
    assert len(set(shared.values())) == 1
    assert all(0 <= b <= 0xFFFFFFFF for b in bases.values())
    assert switch_basis(fabric.switches["s1"].dpid, 5) == bases_of(fabric, 5)["s1"]


def bases_of(fabric, seed):
    return switch_bases(fabric, {"seed": seed})


def test_select_groups_hash_from_their_switchs_basis(fabric):
    fake = program(fabric)
    bases = bases_of(fabric, 0)
    for name, table in fake.tables.items():
        assert table.params and set(table.params.values()) == {bases[name]}, name
    shared = program(fabric, "ecmp:shared_basis=on")
    assert len({p for table in shared.tables.values() for p in table.params.values()}) == 1


def random_band(group_sizes, members, trials=2000, quantile=0.999, seed=11):
    """The max/mean of per-uplink counts when each group's flows pick one of its `members`
    uplinks uniformly at random: the `quantile` of it over `trials` draws."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(trials):
        counts = []
        for flows in group_sizes:
            mine = [0] * members
            for _f in range(flows):
                mine[rng.randrange(members)] += 1
            counts += mine
        ratios.append(max_mean(counts))
    ratios.sort()
    return ratios[int(quantile * (len(ratios) - 1))]


def test_one_basis_everywhere_polarizes_the_second_tier_and_per_switch_bases_spread_it(fabric):
    flows = cross_zone_flows(fabric)
    polarized = uplink_counts(fabric, program(fabric, "ecmp:shared_basis=on"), flows)
    per_spine = {}
    for (spine, _ss), n in polarized.items():
        per_spine.setdefault(spine, []).append(n)
    # a flow that won bucket k at its leaf wins bucket k again at the spine: every spine sends all
    # of its cross-zone flows up one of its two uplinks
    assert all(sorted(counts)[0] == 0 and sorted(counts)[1] > 0 for counts in per_spine.values()), polarized
    spread = uplink_counts(fabric, program(fabric), flows)
    assert all(n > 0 for n in spread.values()), spread
    band = random_band([sum(c) for c in per_spine.values()], 2)
    assert max_mean(list(spread.values())) <= band, (spread, band)
    assert max_mean(list(polarized.values())) > band


def model_path(graph, routes, flow, scheme, seed=0, shared=False):
    """The switches the flow model sends `flow` through, in order."""
    placed = placement.place(graph, routes, [flow], scheme, seed, shared)
    links = [e for e, _share in placed.routes[0][1:-1]]
    return [graph.sw_name[graph.link_src[links[0]]]] + [graph.sw_name[graph.link_dst[e]] for e in links]


def sample_flows(graph, fabric, count=60):
    ports = [p for h in fabric.hosts.values() for p in h.ports]
    rng = random.Random(3)
    pairs = []
    while len(pairs) < count:
        a, b = rng.sample(range(len(ports)), 2)
        if ports[a].leaf != ports[b].leaf:
            pairs.append((a, b))
    out = model_flows.connection_flows(graph, pairs, 1 << 20, qps=2)
    return out, ports


@pytest.mark.parametrize("shared", [False, True])
def test_the_flow_model_sends_each_flow_where_the_switches_groups_do(fabric, shared):
    graph = ClosGraph.from_spec(SPEC)
    routes = Routes(graph)
    fake = program(fabric, f"ecmp:shared_basis={'on' if shared else 'off'}")
    flows, ports = sample_flows(graph, fabric)
    by_ip = {p.ip: p for p in ports}
    for flow in flows:
        src, dst = by_ip[graph.ip_text(flow.src)], by_ip[graph.ip_text(flow.dst)]
        (delivery,) = fake.route(src, fake.packet(src, dst.ip, eth_type=0x0800, ip_proto=17, udp_src=flow.sport,
                                                  udp_dst=4791))
        assert list(delivery.switches) == model_path(graph, routes, flow, "ecmp", shared=shared), flow


def test_the_flow_model_and_the_stage_pick_the_same_e_ecmp_member_at_every_tier(fabric):
    graph = ClosGraph.from_spec(SPEC)
    routes = Routes(graph)
    states = EcmpRouting(fabric).desired()
    bases = bases_of(fabric, 0)
    flows, ports = sample_flows(graph, fabric)
    by_ip = {p.ip: p for p in ports}
    peer = {(link.a, link.a_port): link.b for link in fabric.fabric_links}
    peer.update({(link.b, link.b_port): link.a for link in fabric.fabric_links})
    for flow in flows:
        src, dst = by_ip[graph.ip_text(flow.src)], by_ip[graph.ip_text(flow.dst)]
        members, here, path = None, src.leaf, [src.leaf]
        while here != dst.leaf:
            members = states[here].groups[group_id(fabric.switches[dst.leaf])]
            port = eecmp_member(members, src.ip, dst.ip, flow.sport, flow.dst_qpn, seed=bases[here])
            here = peer[(here, port)]
            path.append(here)
        assert path == model_path(graph, routes, flow, "eecmp"), flow
