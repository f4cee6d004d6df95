"""Path pinning (apps/pinning.py, seed 000 4.1.2) without a network: on the fake switches every
packet to a host takes the member its slice picks, at every tier with a choice, whatever its
5-tuple; a failed pin falls back to the hashed ECMP group and comes back with the link; the flow
model places flows where the switches send them, and shows the paper's fragmented-rack imbalance."""

import pathlib
import random
import statistics

import pytest

from fabriclab.apps import APPS
from fabriclab.apps.control import AppConfig, RunFiles
from fabriclab.apps.core import ControllerCore
from fabriclab.apps.ecmp import PRIO_PREFIX
from fabriclab.apps.pinning import PIN_GROUP_BASE, PRIO_PIN, PinRouting, host_slices, pin_group_id
from fabriclab.model import flows as model_flows
from fabriclab.model import placement
from fabriclab.model.graph import ClosGraph
from fabriclab.model.routes import Routes
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import FabricSpec, load_spec
from tests.unit.fakeoftable import FakeFabric
from tests.unit.routings import parsed

TWO_BY_TWO = pathlib.Path(__file__).parents[1] / "two_by_two.yaml"
# more hosts a leaf (5) than spines (3): slices 0..4 wrap onto spines 1, 2, 3, 1, 2
WRAP = FabricSpec(name="t-wrap", leaves=2, spines=3, hosts_per_leaf=5)
# 2 zones of 2 leaves x 2 spines, 4 super-spines: each spine has 2 uplinks to choose from
THREE = FabricSpec(name="t-pin3", kind="threetier", pods=2, leaves=2, spines=2, super_spines=4, hosts_per_leaf=2,
                   host_rate_mbps=10, fabric_rate_mbps=10, super_spine_rate_mbps=10)


def program(fabric, routing="pinning"):
    name, options = parsed(routing)
    core = ControllerCore(AppConfig(name, options, fabric, RunFiles("/nonexistent"), "run-1"), PinRouting(fabric))
    fake = FakeFabric(fabric)
    fake.connect(core)
    assert core.programmed
    return core, fake


def ports_of(fabric):
    return [p for h in fabric.hosts.values() for p in h.ports]


def packet(fake, src, dst, sport=49152, proto=17):
    return fake.packet(src, dst.ip, eth_type=0x0800, ip_proto=proto, udp_src=sport, udp_dst=4791)


def only_path(fake, src, dst, sport=49152, proto=17):
    """The switches a packet crosses, checked to be its one possible path (no select choice)."""
    (scenario,) = fake.trace(src, packet(fake, src, dst, sport, proto))
    (delivery,) = scenario
    assert delivery.kind == "host" and delivery.where == dst.intf, delivery
    return delivery.switches


def chosen_path(fake, src, dst, sport):
    (delivery,) = fake.route(src, packet(fake, src, dst, sport))
    assert delivery.kind == "host" and delivery.where == dst.intf, delivery
    return delivery.switches


@pytest.fixture(scope="module")
def wide():
    return Fabric(load_spec(str(TWO_BY_TWO)))


# -- the app and its options ----------------------------------------------------------------------
def test_the_app_is_registered_with_the_hashing_options_and_its_model():
    info = APPS["pinning"]
    assert info.routing_class() is PinRouting and info.model == "pinning" and info.stage is None
    assert parsed("pinning:seed=3") == ("pinning", {"seed": 3, "shared_basis": False})
    assert "pinning" in placement.SCHEMES


def test_slices_count_a_leafs_host_ports_in_port_order():
    fabric = Fabric(WRAP)
    slices = host_slices(fabric)
    for leaf in ("l1", "l2"):
        under = sorted((p for p in ports_of(fabric) if p.leaf == leaf), key=lambda p: p.leaf_port)
        assert [slices[p.ip] for p in under] == [0, 1, 2, 3, 4]
    assert pin_group_id(3, fabric.switches["l2"]) > PIN_GROUP_BASE > 0xFFFFFF


# -- where packets go ---------------------------------------------------------------------------------
def test_slices_0_and_1_go_up_different_spines_whatever_the_5_tuple(wide):
    _core, fake = program(wide)
    slices = host_slices(wide)
    ports = ports_of(wide)
    for src in (p for p in ports if p.leaf == "l1"):
        for dst in (p for p in ports if p.leaf == "l2"):
            spine = f"s{slices[dst.ip] + 1}"              # slice 0 -> s1, slice 1 -> s2
            for sport in range(49152, 49152 + 40, 3):
                for proto in (17, 6):
                    assert only_path(fake, src, dst, sport, proto) == ("l1", spine, "l2")


def test_slices_wrap_modulo_the_members():
    fabric = Fabric(WRAP)
    _core, fake = program(fabric)
    src = next(p for p in ports_of(fabric) if p.leaf == "l1")
    under = sorted((p for p in ports_of(fabric) if p.leaf == "l2"), key=lambda p: p.leaf_port)
    spines = [only_path(fake, src, dst)[1] for dst in under]
    assert spines == ["s1", "s2", "s3", "s1", "s2"]


def test_a_down_pin_falls_back_to_the_hashed_group_and_the_pin_comes_back():
    fabric = Fabric(WRAP)
    core, fake = program(fabric)
    src = next(p for p in ports_of(fabric) if p.leaf == "l1")
    dst = min((p for p in ports_of(fabric) if p.leaf == "l2"), key=lambda p: p.leaf_port)     # slice 0: s1
    sports = range(49152, 49152 + 64)
    (link,) = fabric.find_link("l1", "s1")
    table = fake.tables["l1"]
    assert table.lookup(packet(fake, src, dst)).priority == PRIO_PIN

    fake.set_link(link, False)                    # the data plane alone: the failover group's backup
    early = {chosen_path(fake, src, dst, s)[1] for s in sports}
    assert early == {"s2", "s3"}

    fake.port_event(core, link, False)            # the controller hears: the pin gives way to ECMP
    assert table.lookup(packet(fake, src, dst)).priority == PRIO_PREFIX
    late = [chosen_path(fake, src, dst, s)[1] for s in sports]
    assert set(late) == {"s2", "s3"}               # the 5-tuple now decides, as ECMP's hash does
    other = max((p for p in ports_of(fabric) if p.leaf == "l2"), key=lambda p: p.leaf_port)   # slice 4: s2
    assert only_path(fake, src, other) == ("l1", "s2", "l2")       # pins on live members stay

    fake.port_event(core, link, True)
    assert table.lookup(packet(fake, src, dst)).priority == PRIO_PIN
    assert {only_path(fake, src, dst, s)[1] for s in sports} == {"s1"}


def test_a_remote_failure_behind_the_pin_falls_back_too(wide):
    core, fake = program(wide)
    src = next(p for p in ports_of(wide) if p.leaf == "l1")
    dst = min((p for p in ports_of(wide) if p.leaf == "l2"), key=lambda p: p.leaf_port)       # slice 0: s1
    (link,) = wide.find_link("l2", "s1")
    fake.port_event(core, link, False)
    assert only_path(fake, src, dst) == ("l1", "s2", "l2")
    fake.port_event(core, link, True)
    assert only_path(fake, src, dst) == ("l1", "s1", "l2")


def test_the_spines_pin_their_super_spine_uplinks_by_slice_too():
    fabric = Fabric(THREE)
    _core, fake = program(fabric)
    slices = host_slices(fabric)
    group = THREE.super_spines // THREE.spines
    for src in ports_of(fabric):
        for dst in ports_of(fabric):
            if fabric.pod_of(src.leaf) == fabric.pod_of(dst.leaf) or src.host == dst.host:
                continue
            k = slices[dst.ip] % THREE.spines                             # the leaf's uplink
            m = slices[dst.ip] % group                                    # the spine's uplink
            pod = fabric.pod_of(src.leaf)
            path = only_path(fake, src, dst, sport=49152 + 17 * slices[src.ip])
            assert path[1] == f"s{(pod - 1) * THREE.spines + k + 1}", path
            assert path[2] == f"ss{k * group + m + 1}", path


# -- the flow model ---------------------------------------------------------------------------------
def model_path(graph, routes, flow):
    placed = placement.place(graph, routes, [flow], "pinning")
    links = [e for e, _share in placed.routes[0][1:-1]]
    return [graph.sw_name[graph.link_src[links[0]]]] + [graph.sw_name[graph.link_dst[e]] for e in links]


def cable(graph, link):
    (found,) = [c for c in graph.fabric_cables() if graph.link_label(2 * c) == link.label]
    return found


@pytest.mark.parametrize("spec, cut", [(WRAP, None), (WRAP, ("l1", "s1")), (WRAP, ("l2", "s2")),
                                       (THREE, None), (THREE, ("s1", "ss2")), (THREE, ("l1", "s1"))])
def test_the_flow_model_places_flows_where_the_switches_send_them(spec, cut):
    fabric, graph = Fabric(spec), ClosGraph.from_spec(spec)
    core, fake = program(fabric)
    down = set()
    if cut:
        (link,) = fabric.find_link(*cut)
        fake.port_event(core, link, False)
        down = {cable(graph, link)}
    routes = Routes(graph, down)
    ports = ports_of(fabric)
    rng = random.Random(5)
    pairs = []
    while len(pairs) < 40:
        a, b = rng.sample(range(len(fabric.hosts)), 2)
        if ports[a].leaf != ports[b].leaf:
            pairs.append((a, b))
    by_ip = {p.ip: p for p in ports}
    for flow in model_flows.connection_flows(graph, pairs, 1 << 20, qps=2):
        src, dst = by_ip[graph.ip_text(flow.src)], by_ip[graph.ip_text(flow.dst)]
        assert list(chosen_path(fake, src, dst, flow.sport)) == model_path(graph, routes, flow), flow


def uplink_loads(graph, flows):
    """Flows on each leaf-to-spine link (every one listed)."""
    placed = placement.place(graph, Routes(graph), flows, "pinning")
    counts = {e: 0 for leaf in graph.leaves for links in graph.adj[leaf].values() for e in links}
    for route in placed.routes:
        for e, _share in route[1:-1]:
            if e in counts:
                counts[e] += 1
    return list(counts.values())


def test_fragmented_racks_load_the_uplinks_unevenly_and_full_racks_evenly():
    graph = ClosGraph.from_spec(FabricSpec(name="t-racks", leaves=4, spines=2, hosts_per_leaf=2))
    slices = placement.port_slices(graph)
    hosts = range(graph.params.hosts)

    def leaf(h):
        return graph.port_leaf[graph.host_port_ids[h][0] - graph.n_switches]

    def all_pairs(active):
        pairs = [(a, b) for a in active for b in active if leaf(a) != leaf(b)]
        return model_flows.connection_flows(graph, pairs, 1 << 20)

    full = uplink_loads(graph, all_pairs(hosts))
    assert min(full) == max(full) > 0
    # one of each rack's two hosts in the job: every flow goes to a slice-0 host, up spine 1
    fragmented = uplink_loads(graph, all_pairs([h for h in hosts
                                                if slices[graph.host_port_ids[h][0] - graph.n_switches] == 0]))
    assert max(fragmented) / statistics.fmean(fragmented) == 2.0 and min(fragmented) == 0
