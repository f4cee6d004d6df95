"""The fabric graph: counts, names, addresses, port numbers and the JSON the controller reads.

The Mininet builder, the controller and the CLI each rebuild this graph from the spec and must agree
on every name and number, so these tests pin the conventions down.
"""

import ipaddress
import json
from collections import Counter

import pytest

from fabriclab.errors import SpecError
from fabriclab.topologies.fabric import Fabric, beyond_one_machine, counts, leaf_subnet, switch_dpid
from fabriclab.topologies.spec import MAX_LEAVES, FabricSpec, load_spec, shipped_specs

IFNAMSIZ = 15   # Linux interface names: 15 characters and the terminating NUL

SPECS = {
    "leafspine": dict(leaves=3, spines=2, hosts_per_leaf=2),
    "dual_nic": dict(leaves=2, spines=3, hosts_per_leaf=3, nics_per_host=2),
    "parallel": dict(leaves=3, spines=2, hosts_per_leaf=1, parallel_links=3),
    "multiplane": dict(kind="multiplane", planes=3, leaves=2, spines=2, hosts_per_leaf=2),
    "multiplane_full": dict(kind="multiplane", planes=4, leaves=3, spines=2, hosts_per_leaf=2,
                            nics_per_host=2, parallel_links=2),
    "rail": dict(leaves=4, spines=2, hosts_per_leaf=3, nics_per_host=2, cabling="rail"),
    "rail_multiplane": dict(kind="multiplane", planes=2, leaves=3, spines=2, hosts_per_leaf=2,
                            nics_per_host=3, cabling="rail"),
}


def fabric(**fields):
    return Fabric(FabricSpec(name="t", **fields))


def all_fabrics():
    built = {key: fabric(**fields) for key, fields in SPECS.items()}
    built.update({f"shipped:{name}": Fabric(load_spec(name)) for name in shipped_specs()})
    return built


FABRICS = all_fabrics()


@pytest.fixture(params=sorted(FABRICS))
def any_fabric(request):
    return FABRICS[request.param]


def interface_names(fab):
    """Every interface a link creates: host ports and switch ports."""
    return [link.a_intf for link in fab.links] + [link.b_intf for link in fab.links]


# -- counts --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, switches, hosts, host_ports, fabric_links", [
    (dict(leaves=2, spines=2, hosts_per_leaf=1), 4, 2, 2, 4),
    (dict(leaves=4, spines=4, hosts_per_leaf=2), 8, 8, 8, 16),
    (dict(leaves=3, spines=2, hosts_per_leaf=3, nics_per_host=2), 5, 9, 18, 6),
    (dict(leaves=4, spines=2, hosts_per_leaf=4, parallel_links=2), 6, 16, 16, 16),
    (dict(leaves=2, spines=3, hosts_per_leaf=1, parallel_links=4), 5, 2, 2, 24),
    (dict(kind="multiplane", planes=4, leaves=3, spines=2, hosts_per_leaf=4, parallel_links=2), 20, 12, 48, 48),
    (dict(kind="multiplane", planes=2, leaves=2, spines=2, hosts_per_leaf=2, nics_per_host=2), 8, 4, 16, 8),
])
def test_counts(fields, switches, hosts, host_ports, fabric_links):
    fab = fabric(**fields)
    assert len(fab.switches) == switches
    assert len(fab.hosts) == hosts
    assert sum(len(h.ports) for h in fab.hosts.values()) == host_ports
    assert len(fab.host_links) == host_ports
    assert len(fab.fabric_links) == fabric_links
    assert len(fab.links) == host_ports + fabric_links
    summary = fab.summary()
    assert (summary["switches"], summary["hosts"], summary["host_ports"], summary["links"]) == (
        switches, hosts, host_ports, host_ports + fabric_links)


def test_counted_is_built(any_fabric):
    """`check` reports a fabric from counts(spec), building nothing: they must be what is built."""
    built = {"switches": len(any_fabric.switches), "hosts": len(any_fabric.hosts),
             "host_ports": sum(len(h.ports) for h in any_fabric.hosts.values()), "links": len(any_fabric.links)}
    assert counts(any_fabric.spec) == built


def test_a_fabric_no_lab_could_build_is_refused_before_naming_a_port():
    # issue 35: 99 planes of the largest leafspine are 32 million links (minutes, over 10 GB)
    spec = FabricSpec(name="big", kind="multiplane", planes=99, leaves=MAX_LEAVES, spines=64,
                      hosts_per_leaf=253, parallel_links=16)
    assert counts(spec)["links"] == 32_111_442
    with pytest.raises(SpecError, match="a lab over 64 machines builds at most"):
        Fabric(spec)
    assert "one machine's lab builds at most 1024" in beyond_one_machine(spec)
    assert beyond_one_machine(load_spec("default")) is None


def test_counts_by_role_and_plane(any_fabric):
    spec = any_fabric.spec
    roles = Counter((s.role, s.plane) for s in any_fabric.switches.values())
    for plane in range(1, spec.planes + 1):
        assert roles[("leaf", plane)] == spec.leaves * spec.pods
        assert roles[("spine", plane)] == spec.spines * spec.pods
        assert len(any_fabric.leaves(plane)) == spec.leaves * spec.pods
    assert roles[("super_spine", 1)] == spec.super_spines
    assert len(any_fabric.leaves()) == spec.leaves * spec.planes * spec.pods
    assert sum(roles.values()) == len(any_fabric.switches)


def test_every_leaf_spine_pair_has_parallel_links_members(any_fabric):
    spec = any_fabric.spec
    core = set(any_fabric.core_links)
    pairs = Counter((link.a, link.b) for link in any_fabric.fabric_links if link not in core)
    assert len(pairs) == spec.planes * spec.pods * spec.leaves * spec.spines
    assert set(pairs.values()) == {spec.parallel_links}
    for link in any_fabric.fabric_links:
        lower, upper = any_fabric.switches[link.a], any_fabric.switches[link.b]
        assert (lower.role, upper.role) == (("spine", "super_spine") if link in core else ("leaf", "spine"))
        assert lower.plane == upper.plane == link.plane
        assert link in core or lower.pod == upper.pod


def test_each_host_has_one_port_per_nic_per_plane(any_fabric):
    spec = any_fabric.spec
    for host in any_fabric.hosts.values():
        assert sorted((p.nic, p.plane) for p in host.ports) == [
            (nic, plane) for nic in range(spec.nics_per_host) for plane in range(1, spec.planes + 1)]
        for port in host.ports:
            leaf = any_fabric.switches[port.leaf]
            # rack: the host's one leaf; rail: leaf `nic` of its rail group
            index = (host.leaf_index if spec.cabling == "rack"
                     else (host.group - 1) * spec.nics_per_host + port.nic + 1)
            assert (leaf.role, leaf.plane, leaf.index) == ("leaf", port.plane, index)


def test_hosts_fill_leaves_in_order():
    fab = fabric(leaves=3, spines=1, hosts_per_leaf=2)
    assert [fab.hosts[f"h{i}"].leaf_index for i in range(1, 7)] == [1, 1, 2, 2, 3, 3]


def test_rail_cabling_puts_nic_i_of_a_group_on_its_rail_leaf_i():
    fab = fabric(leaves=4, spines=2, hosts_per_leaf=3, nics_per_host=2, cabling="rail")
    assert len(fab.hosts) == 6 and [fab.hosts[f"h{i}"].group for i in range(1, 7)] == [1, 1, 1, 2, 2, 2]
    assert all(h.leaf_index is None for h in fab.hosts.values())
    assert [(p.intf, p.leaf, p.leaf_port, p.ip) for p in fab.hosts["h5"].ports] == [
        ("h5-n0", "l3", 2, "10.1.3.2"), ("h5-n1", "l4", 2, "10.1.4.2")]
    # each rail leaf holds one NIC of every host of its group, the same NIC index
    for leaf in fab.leaves():
        owners = [fab.port_owner[(leaf.name, n)] for n in range(1, 4)]
        assert {p.nic for p in owners} == {(leaf.index - 1) % 2}
        assert [p.host for p in owners] == [f"h{(leaf.index - 1) // 2 * 3 + k}" for k in (1, 2, 3)]
    assert fab.summary()["cabling"] == "rail"


def test_rack_cabling_keeps_every_nic_under_the_hosts_leaf():
    fab = fabric(leaves=2, spines=2, hosts_per_leaf=2, nics_per_host=2)
    assert {p.leaf for p in fab.hosts["h3"].ports} == {"l2"}
    assert fab.hosts["h3"].leaf_index == fab.hosts["h3"].group == 2


def test_rail_multiplane_keeps_rails_in_every_plane():
    fab = fabric(kind="multiplane", planes=2, leaves=2, spines=1, hosts_per_leaf=2, nics_per_host=2,
                 cabling="rail")
    assert [(p.intf, p.leaf, p.ip) for p in fab.hosts["h2"].ports] == [
        ("h2-n0p1", "p1l1", "10.1.1.2"), ("h2-n0p2", "p2l1", "10.2.1.2"),
        ("h2-n1p1", "p1l2", "10.1.2.2"), ("h2-n1p2", "p2l2", "10.2.2.2")]
    assert [p.intf for p in fab.hosts["h2"].nic_ports(1)] == ["h2-n1p1", "h2-n1p2"]


def test_link_rates_follow_the_spec():
    fab = fabric(leaves=2, spines=2, hosts_per_leaf=1, host_rate_mbps=25, fabric_rate_mbps=40)
    assert {link.rate_mbps for link in fab.host_links} == {25}
    assert {link.rate_mbps for link in fab.fabric_links} == {40}


# -- names and numbers ------------------------------------------------------------------------------------

def test_names_macs_ips_dpids_are_unique(any_fabric):
    nodes = list(any_fabric.switches) + list(any_fabric.hosts)
    assert len(set(nodes)) == len(nodes)
    ports = [p for host in any_fabric.hosts.values() for p in host.ports]
    for attribute in ("mac", "ip", "intf"):
        values = [getattr(p, attribute) for p in ports]
        assert len(set(values)) == len(values), attribute
    dpids = [s.dpid for s in any_fabric.switches.values()]
    assert len(set(dpids)) == len(dpids)
    names = interface_names(any_fabric)
    assert len(set(names)) == len(names)


def test_macs_are_locally_administered_unicast(any_fabric):
    for host in any_fabric.hosts.values():
        for port in host.ports:
            first = int(port.mac.split(":")[0], 16)
            assert len(port.mac.split(":")) == 6
            assert first & 0x02 and not first & 0x01, port.mac


def test_naming_conventions():
    fab = fabric(leaves=2, spines=2, hosts_per_leaf=1)
    assert sorted(fab.switches) == ["l1", "l2", "s1", "s2"]
    assert fab.hosts["h2"].ports[0].intf == "h2-n0"
    mp = fabric(kind="multiplane", planes=2, leaves=2, spines=1, hosts_per_leaf=1)
    assert sorted(mp.switches) == ["p1l1", "p1l2", "p1s1", "p2l1", "p2l2", "p2s1"]
    assert sorted(p.intf for p in mp.hosts["h1"].ports) == ["h1-n0p1", "h1-n0p2"]


def test_dpid_encodes_tier_plane_and_index():
    assert switch_dpid("leaf", 1, 1) == 0x1_0001_0001
    assert switch_dpid("spine", 2, 3) == 0x2_0002_0003
    fab = fabric(kind="multiplane", planes=2, leaves=2, spines=2, hosts_per_leaf=1)
    assert fab.switches["p2s1"].dpid == switch_dpid("spine", 2, 1)
    assert fab.switches["p2s1"].tier == 1 and fab.switches["p2l1"].tier == 0


def test_interface_names_fit_linux_for_every_shipped_spec():
    for name in shipped_specs():
        assert max(map(len, interface_names(Fabric(load_spec(name))))) <= IFNAMSIZ, name


def test_interface_names_fit_linux_for_the_largest_leafspine():
    # Every count at its limit: 254 leaves, 253 host ports and 64 x 16 uplinks on each leaf.
    fab = fabric(leaves=MAX_LEAVES, spines=64, parallel_links=16, hosts_per_leaf=253)
    names = interface_names(fab) + [p.intf for h in fab.hosts.values() for p in h.ports]
    assert "l254-eth1277" in names
    assert max(map(len, names)) <= IFNAMSIZ


def test_interface_names_fit_linux_for_a_254_leaf_multiplane():
    fab = fabric(kind="multiplane", planes=12, leaves=MAX_LEAVES, spines=4, parallel_links=2,
                 hosts_per_leaf=2, nics_per_host=2)
    names = interface_names(fab)
    assert "p12l254-eth12" in names and "p12s4-eth508" in names and "h508-n1p12" in names
    assert max(map(len, names)) <= IFNAMSIZ


# -- addresses ---------------------------------------------------------------------------------------------

def test_each_leaf_host_ports_fall_in_its_24(any_fabric):
    for leaf in any_fabric.leaves():
        subnet = ipaddress.ip_network(leaf_subnet(leaf.plane, leaf.index))
        ports = [p for host in any_fabric.hosts.values() for p in host.ports if p.leaf == leaf.name]
        assert len(ports) == any_fabric.spec.host_ports_per_leaf
        for port in ports:
            address = ipaddress.ip_address(port.ip)
            assert address in subnet
            assert address not in (subnet.network_address, subnet.broadcast_address)


def test_leaf_subnets_do_not_overlap(any_fabric):
    subnets = [ipaddress.ip_network(leaf_subnet(l.plane, l.index)) for l in any_fabric.leaves()]
    assert len(set(subnets)) == len(subnets)


def test_addresses_of_a_full_leaf():
    fab = fabric(leaves=2, spines=1, hosts_per_leaf=253)
    last = fab.hosts["h506"].ports[0]
    assert (last.ip, last.leaf, last.leaf_port) == ("10.1.2.253", "l2", 253)


# -- OpenFlow port numbers -----------------------------------------------------------------------------------

def switch_ends(fab):
    """Every (switch, port number, interface name) a link plugs into."""
    ends = []
    for link in fab.links:
        for node, port, intf in ((link.a, link.a_port, link.a_intf), (link.b, link.b_port, link.b_intf)):
            if node in fab.switches:
                ends.append((node, port, intf))
    return ends


def test_no_two_links_share_a_switch_port(any_fabric):
    used = Counter((switch, port) for switch, port, _intf in switch_ends(any_fabric))
    assert max(used.values()) == 1


def test_switch_ports_lists_every_cabled_port(any_fabric):
    ends = switch_ends(any_fabric)
    for name in any_fabric.switches:
        expected = {port: intf for switch, port, intf in ends if switch == name}
        ports = any_fabric.switch_ports(name)
        assert ports == expected
        assert list(ports) == sorted(ports)
        assert all(intf == f"{name}-eth{port}" for port, intf in ports.items())


def test_leaf_ports_are_host_ports_then_uplinks(any_fabric):
    spec = any_fabric.spec
    host_ports = spec.host_ports_per_leaf
    uplinks = spec.spines * spec.parallel_links
    for leaf in any_fabric.leaves():
        ports = any_fabric.switch_ports(leaf.name)
        assert list(ports) == list(range(1, host_ports + uplinks + 1))
        owners = {any_fabric.port_owner[(leaf.name, n)].host for n in range(1, host_ports + 1)}
        assert len(owners) == spec.hosts_per_leaf
    group = spec.super_spines // spec.spines        # threetier: uplinks after the leaf ports
    for spine in (s for s in any_fabric.switches.values() if s.role == "spine"):
        assert list(any_fabric.switch_ports(spine.name)) == list(range(1, spec.leaves * spec.parallel_links + group + 1))


def test_host_links_have_no_switch_port_on_the_host_side(any_fabric):
    for link in any_fabric.host_links:
        assert link.a in any_fabric.hosts and link.a_port == -1
        assert any_fabric.port_owner[(link.b, link.b_port)].intf == link.a_intf


def test_switch_ports_of_an_unknown_switch_is_empty():
    assert fabric().switch_ports("nope") == {}


# -- lookups -------------------------------------------------------------------------------------------------

def test_host_port_by_host_name_ip_and_interface():
    fab = fabric(leaves=2, spines=2, hosts_per_leaf=2, nics_per_host=2)
    first = fab.host_port("h3")
    assert (first.host, first.nic, first.leaf, first.ip) == ("h3", 0, "l2", "10.1.2.1")
    second = fab.host_port("h3-n1")
    assert (second.nic, second.ip, second.leaf_port) == (1, "10.1.2.2", 2)
    assert fab.host_port("10.1.2.2") is second
    assert fab.host_port("10.1.9.9") is None
    assert fab.host_port("h99") is None
    assert fab.host_port("l1-eth1") is None


def test_host_port_by_interface_in_a_multiplane_fabric():
    fab = fabric(kind="multiplane", planes=4, leaves=3, spines=2, hosts_per_leaf=2)
    port = fab.host_port("h5-n0p3")
    assert (port.plane, port.leaf, port.ip) == (3, "p3l3", "10.3.3.1")
    assert fab.host_port(port.ip) == port
    assert fab.host_port("h5").plane == 1


def test_find_link_with_parallel_members():
    fab = fabric(leaves=2, spines=2, hosts_per_leaf=1, parallel_links=3)
    members = fab.find_link("l2", "s1")
    assert [link.member for link in members] == [0, 1, 2]
    assert fab.find_link("s1", "l2") == members
    assert fab.find_link("l2", "s1", member=1) == [members[1]]
    assert fab.find_link("l2", "s1", member=3) == []
    assert [link.label for link in members] == ["l2-s1", "l2-s1#2", "l2-s1#3"]
    assert len({link.key for link in members}) == 3
    assert fab.find_link("l1", "l2") == []


def test_find_link_for_a_host_link():
    fab = fabric(leaves=2, spines=2, hosts_per_leaf=1)
    (link,) = fab.find_link("h2", "l2")
    assert (link.kind, link.b_port, link.a_intf) == ("host", 1, "h2-n0")


def test_buffer_bytes_by_role():
    spec = load_spec("meta_ai_zone")
    fab = Fabric(spec)
    assert fab.buffer_bytes("h1") == spec.buffers.host
    assert fab.buffer_bytes("l1") == spec.buffers.leaf
    assert fab.buffer_bytes("s4") == spec.buffers.spine


# -- JSON ------------------------------------------------------------------------------------------------------

def test_json_round_trip(any_fabric):
    text = any_fabric.to_json()
    json.loads(text)
    again = Fabric.from_json(text)
    assert again.spec == any_fabric.spec
    assert again.switches == any_fabric.switches
    assert again.hosts == any_fabric.hosts
    assert again.links == any_fabric.links
    assert again.to_json() == text


def test_json_round_trip_keeps_optional_fields():
    spec = FabricSpec(name="j", description="a fabric, with \"quotes\" and ünïcode", real_host_rate_mbps=None,
                      host_rate_mbps=2.5)
    again = Fabric.from_json(Fabric(spec).to_json())
    assert again.spec == spec
    assert again.spec.real_host_rate_mbps is None
