"""Where packets go, without a network: the controller core programs a fake fabric (one fake
OpenFlow table per switch, fakeoftable.py) and packets are traced through it.

- ECMP reaches every host port from every host port, over exactly the shortest paths.
- TE's placement entries override ECMP for the placed flows only.
- Steering entries for an in-network service take precedence and rewrite correctly; everything
  else still follows ECMP (and TE).
- A link down removes that path: at once for the switch that owns the dead port (watched buckets),
  everywhere once the controller has recomputed.
"""

import pytest

from fabriclab.apps.control import AppConfig, RunFiles, SteeringPlan
from fabriclab.apps.core import ControllerCore
from fabriclab.apps.ecmp import EcmpRouting
from fabriclab.apps.paths import all_paths
from fabriclab.apps.te import Demand, DemandKey, TeRouting, cspf
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import FabricSpec, load_spec
from tests.unit.fakeoftable import FakeFabric

SERVICE, GROUP, UDP_SERVICE = "10.1.255.1", "10.1.254.1", 27182


def programmed(fab, routing, plan=None):
    """A core with `routing` and every switch of a fake fabric connected and programmed."""
    core = ControllerCore(AppConfig("test", {}, fab, RunFiles("/nonexistent")), routing)
    fake = FakeFabric(fab)
    fake.connect(core)
    if plan is not None:
        fake.apply(core.steering_changed(SteeringPlan("g1", plan)))
        fake.acknowledge(core)
    assert core.programmed
    return core, fake


def host_ports(fab):
    return [p for host in fab.hosts.values() for p in host.ports]


def shortest_hops(fab, src, dst, down=frozenset()):
    """The (switch, in_port) sequence of every shortest path from src's leaf to dst's leaf."""
    out = set()
    for path in all_paths(fab, src.leaf, dst.leaf, down):
        node, hops = src.leaf, [(src.leaf, src.leaf_port)]
        for link in path:
            node, port = (link.b, link.b_port) if link.a == node else (link.a, link.a_port)
            hops.append((node, port))
        out.add(tuple(hops))
    return out


def reached_over(fake, src, dst, **fields):
    """The hops of every scenario, asserting that each delivers exactly one copy, to `dst`."""
    scenarios = fake.trace(src, fake.packet(src, dst.ip, **fields))
    for scenario in scenarios:
        assert [(d.kind, d.where) for d in scenario] == [("host", dst.intf)], (src.intf, dst.intf, scenario)
    return {scenario[0].hops for scenario in scenarios}


def link(fab, a, b, member=None):
    (found,) = fab.find_link(a, b, member)
    return found


# -- ECMP ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["tiny", "default", "parallel_links", "meta_ai_zone", "spectrumx_fig16"])
def test_ecmp_reaches_every_host_port_over_every_shortest_path(spec):
    fab = Fabric(load_spec(spec))
    _core, fake = programmed(fab, EcmpRouting(fab))
    for src in host_ports(fab):
        for dst in host_ports(fab):
            if dst.host == src.host:
                continue
            if dst.plane != src.plane:           # planes are separate fabrics
                assert all(d.kind == "drop" for d in fake.deliveries(src, fake.packet(src, dst.ip)))
                continue
            assert reached_over(fake, src, dst) == shortest_hops(fab, src, dst), (src.intf, dst.intf)


def test_arp_goes_to_the_controller_and_nowhere_else():
    fab = Fabric(load_spec("default"))
    _core, fake = programmed(fab, EcmpRouting(fab))
    src = fab.hosts["h1"].ports[0]
    arp = fake.packet(src, fab.hosts["h8"].ports[0].ip, eth_type=0x0806, ip_proto=None, udp_src=None,
                      udp_dst=None)
    assert [(d.kind, d.where) for d in fake.deliveries(src, arp)] == [("controller", "l1")]


# -- TE over ECMP ------------------------------------------------------------------------------------------
@pytest.fixture
def three_leaves():
    return Fabric(FabricSpec(name="t-te", leaves=3, spines=2, hosts_per_leaf=2,
                             host_rate_mbps=10, fabric_rate_mbps=10))


def te_routing(fab, *demands):
    routing = TeRouting(fab)
    routing.placement = cspf(fab, [Demand(DemandKey(src.leaf, src.leaf_port, dst_leaf), mbps, "test", src.intf)
                                   for src, dst_leaf, mbps in demands])
    return routing


def test_te_placement_overrides_ecmp_for_the_placed_flows_only(three_leaves):
    fab = three_leaves
    h1, h2, h3, h4, h5 = (fab.hosts[f"h{i}"].ports[0] for i in range(1, 6))
    routing = te_routing(fab, (h1, "l2", 10.0))
    (route,) = routing.placement.placed.values()
    _core, fake = programmed(fab, routing)
    # h1 -> l2 is placed: one path, through the spine CSPF chose, for every source port
    for sport in (1000, 2000, 3000, 4000):
        (hops,) = reached_over(fake, h1, h3, udp_src=sport)
        assert tuple(s for s, _p in hops) == route.nodes
    assert len(reached_over(fake, h1, h4)) == 1
    # h1 -> l3 (not placed), h2 -> l2 (another source port), l2 -> h1: ECMP's two paths
    assert reached_over(fake, h1, h5) == shortest_hops(fab, h1, h5)
    assert reached_over(fake, h2, h3) == shortest_hops(fab, h2, h3)
    assert reached_over(fake, h3, h1) == shortest_hops(fab, h3, h1)
    # under its own leaf, h1 still reaches h2 directly
    assert reached_over(fake, h1, h2) == {(("l1", h1.leaf_port),)}


def test_te_two_placed_flows_take_different_spines(three_leaves):
    fab = three_leaves
    h1, h2, h3 = (fab.hosts[f"h{i}"].ports[0] for i in range(1, 4))
    _core, fake = programmed(fab, te_routing(fab, (h1, "l2", 10.0), (h2, "l2", 10.0)))
    spines = {hops[1][0] for src in (h1, h2) for hops in reached_over(fake, src, h3)}
    assert spines == {"s1", "s2"}


def test_te_falls_back_to_ecmp_in_the_data_plane_then_in_the_controller(three_leaves):
    fab = three_leaves
    h1, h3 = fab.hosts["h1"].ports[0], fab.hosts["h3"].ports[0]
    routing = te_routing(fab, (h1, "l2", 10.0))
    (route,) = routing.placement.placed.values()
    core, fake = programmed(fab, routing)
    spine = route.nodes[1]
    other = next(s for s in ("s1", "s2") if s != spine)
    uplink = link(fab, "l1", spine)
    # the placed uplink dies: the fast-failover group moves the flow before the controller knows
    fake.set_link(uplink, False)
    assert {hops[1][0] for hops in reached_over(fake, h1, h3)} == {other}
    # the controller hears of it: the entry goes back to ECMP, which has only the other spine left
    fake.port_event(core, uplink, False)
    assert core.programmed
    assert reached_over(fake, h1, h3) == shortest_hops(fab, h1, h3, {uplink.key})


def test_te_drops_a_placement_whose_remote_link_failed(three_leaves):
    fab = three_leaves
    h1, h3 = fab.hosts["h1"].ports[0], fab.hosts["h3"].ports[0]
    routing = te_routing(fab, (h1, "l2", 10.0))
    (route,) = routing.placement.placed.values()
    core, fake = programmed(fab, routing)
    remote = link(fab, "l2", route.nodes[1])
    # the leaf's own port stays up, so only the controller can move the flow off that spine
    fake.set_link(remote, False)
    assert [d.kind for d in fake.deliveries(h1, fake.packet(h1, h3.ip))] == ["drop"]
    fake.port_event(core, remote, False)
    assert reached_over(fake, h1, h3) == shortest_hops(fab, h1, h3, {remote.key})


# -- steering ------------------------------------------------------------------------------------------------
@pytest.fixture
def six_hosts():
    return Fabric(FabricSpec(name="t-steer", leaves=2, spines=2, hosts_per_leaf=3,
                             host_rate_mbps=10, fabric_rate_mbps=10))


def steering_plan(fab):
    """A service on l1 served by h3, a group on l1 of h1 and h2, and routes to the service from
    l2 through s1 (l2's port 4 faces s1, s1's port 1 faces l1)."""
    def to(host):
        p = fab.hosts[host].ports[0]
        return {"ip": p.ip, "mac": p.mac, "via": p.leaf_port}
    assert link(fab, "l2", "s1").a_port == 4 and link(fab, "l1", "s1").b_port == 1
    return {"services": [{"switch": "l1", "address": SERVICE, "udp_dst": UDP_SERVICE, "to": to("h3")}],
            "groups": [{"switch": "l1", "address": GROUP, "members": [to("h1"), to("h2")]}],
            "routes": [{"switch": "l2", "address": SERVICE, "via": 4},
                       {"switch": "s1", "address": SERVICE, "via": 1}]}


def rewritten(delivery):
    return delivery.where, delivery.packet.eth_dst, delivery.packet.ipv4_dst


def test_a_service_address_reaches_the_server_rewritten_from_anywhere(six_hosts):
    fab = six_hosts
    _core, fake = programmed(fab, EcmpRouting(fab), steering_plan(fab))
    server = fab.hosts["h3"].ports[0]
    for sender in ("h1", "h2", "h4", "h6"):
        src = fab.hosts[sender].ports[0]
        scenarios = fake.trace(src, fake.packet(src, SERVICE, udp_dst=UDP_SERVICE, eth_dst="02:fa:b1:00:00:01"))
        assert len(scenarios) == 1, sender                  # steered, not hashed
        (delivery,) = scenarios[0]
        assert rewritten(delivery) == (server.intf, server.mac, server.ip), sender
        if sender in ("h4", "h6"):
            assert delivery.switches == ("l2", "s1", "l1")
    # the server itself sends to the service: the hairpin entry sends it back by IN_PORT
    (scenario,) = fake.trace(server, fake.packet(server, SERVICE, udp_dst=UDP_SERVICE))
    assert [rewritten(d) for d in scenario] == [(server.intf, server.mac, server.ip)]


def test_a_group_address_reaches_every_member_with_its_own_rewrite(six_hosts):
    fab = six_hosts
    _core, fake = programmed(fab, EcmpRouting(fab), steering_plan(fab))
    h1, h2, h3 = (fab.hosts[h].ports[0] for h in ("h1", "h2", "h3"))
    members = {(h1.intf, h1.mac, h1.ip), (h2.intf, h2.mac, h2.ip)}
    for sender in (h3, h1, h2):             # from h1 or h2 a copy must go back out of its own port
        (scenario,) = fake.trace(sender, fake.packet(sender, GROUP, udp_dst=UDP_SERVICE))
        assert sorted(rewritten(d) for d in scenario) == sorted(members), sender.intf


def test_steering_leaves_everything_else_on_ecmp(six_hosts):
    fab = six_hosts
    _core, plain = programmed(fab, EcmpRouting(fab))
    _core, steered = programmed(fab, EcmpRouting(fab), steering_plan(fab))
    for src in host_ports(fab):
        for dst in host_ports(fab):
            if src != dst:
                for sport in (4791, UDP_SERVICE):
                    packet = plain.packet(src, dst.ip, udp_src=sport, udp_dst=UDP_SERVICE)
                    assert steered.trace(src, packet) == plain.trace(src, packet)
    # the service address on another port is no service: nothing routes 10.1.255.0/24
    src = fab.hosts["h1"].ports[0]
    assert [d.kind for d in steered.deliveries(src, steered.packet(src, SERVICE, udp_dst=9))] == ["drop"]


def test_steering_takes_precedence_over_te_and_te_over_ecmp(six_hosts):
    """A service address inside l2's prefix, served beside l1: from h1, whose flows to l2 TE
    has placed, the service's packets still reach the server; other ports follow TE's entry."""
    fab = six_hosts
    h1, h3, h4 = (fab.hosts[h].ports[0] for h in ("h1", "h3", "h4"))
    inside = "10.1.2.200"
    plan = {"services": [{"switch": "l1", "address": inside, "udp_dst": UDP_SERVICE,
                          "to": {"ip": h3.ip, "mac": h3.mac, "via": h3.leaf_port}}]}
    routing = te_routing(fab, (h1, "l2", 10.0))
    (route,) = routing.placement.placed.values()
    _core, fake = programmed(fab, routing, plan)
    (scenario,) = fake.trace(h1, fake.packet(h1, inside, udp_dst=UDP_SERVICE))
    assert [rewritten(d) for d in scenario] == [(h3.intf, h3.mac, h3.ip)]
    (scenario,) = fake.trace(h1, fake.packet(h1, inside, udp_dst=9))
    assert [(d.kind, d.switches) for d in scenario] == [("drop", route.nodes)]   # l2 has no such host
    (hops,) = reached_over(fake, h1, h4)
    assert tuple(s for s, _p in hops) == route.nodes


def test_clearing_the_plan_takes_only_the_steering_away(six_hosts):
    fab = six_hosts
    core, fake = programmed(fab, EcmpRouting(fab), steering_plan(fab))
    _core, plain = programmed(fab, EcmpRouting(fab))
    fake.apply(core.steering_changed(None))
    fake.acknowledge(core)
    assert core.programmed
    assert {n: t.snapshot() for n, t in fake.tables.items()} == {n: t.snapshot() for n, t in plain.tables.items()}


# -- links down --------------------------------------------------------------------------------------------------
def test_a_link_down_removes_its_paths_and_coming_back_restores_them():
    fab = Fabric(load_spec("default"))
    core, fake = programmed(fab, EcmpRouting(fab))
    cut = link(fab, "l1", "s1")
    h1, h3 = fab.hosts["h1"].ports[0], fab.hosts["h3"].ports[0]
    fake.set_link(cut, False)
    # l1 stops using its dead port at once (the buckets watch it) ...
    assert reached_over(fake, h1, h3) == shortest_hops(fab, h1, h3, {cut.key})
    # ... but l2 still hashes some flows to s1, which cannot reach l1 until the controller acts
    kinds = [d.kind for d in fake.deliveries(h3, fake.packet(h3, h1.ip))]
    assert kinds.count("drop") == 1 and kinds.count("host") == 3
    fake.port_event(core, cut, False)
    assert core.programmed
    for src in host_ports(fab):
        for dst in host_ports(fab):
            if src.host != dst.host:
                assert reached_over(fake, src, dst) == shortest_hops(fab, src, dst, {cut.key})
    fake.port_event(core, cut, True)
    for src in host_ports(fab):
        for dst in host_ports(fab):
            if src.host != dst.host:
                assert reached_over(fake, src, dst) == shortest_hops(fab, src, dst)


def test_a_cut_off_leaf_drops_instead_of_looping():
    fab = Fabric(load_spec("tiny"))
    core, fake = programmed(fab, EcmpRouting(fab))
    h1, h2 = fab.hosts["h1"].ports[0], fab.hosts["h2"].ports[0]
    for spine in ("s1", "s2"):
        fake.port_event(core, link(fab, "l2", spine), False)
    assert [d.kind for d in fake.deliveries(h1, fake.packet(h1, h2.ip))] == ["drop"]
