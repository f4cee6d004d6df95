"""Steering plans (in-network services beside a switch) as OpenFlow state, without a switch."""

import types

import pytest
from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from fabriclab.apps import openflow, steering
from fabriclab.apps.ecmp import EcmpRouting, diff
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import FabricSpec

FABRIC = Fabric(FabricSpec(name="t-steer", leaves=2, spines=2, hosts_per_leaf=3,
                           host_rate_mbps=10, fabric_rate_mbps=10))


def _port(host):
    return FABRIC.hosts[host].ports[0]


def _to(host):
    p = _port(host)
    return {"ip": p.ip, "mac": p.mac, "via": p.leaf_port}


def _plan():
    return {"generation": 1,
            "services": [{"switch": "l1", "address": "10.1.255.1", "udp_dst": 27182, "to": _to("h3")}],
            "groups": [{"switch": "l1", "address": "10.1.254.1", "members": [_to("h1"), _to("h2")]}],
            "routes": [{"switch": "l2", "address": "10.1.255.1", "via": 4}]}       # l2 port 4: an uplink


def test_a_service_rewrites_to_the_server_and_a_group_replicates_to_every_member():
    states = steering.steering_state(FABRIC, _plan())
    l1 = states["l1"]
    h1, h2, h3 = _port("h1"), _port("h2"), _port("h3")
    service = next(f for f in l1.flows if f.match_dict.get("udp_dst") == 27182 and "in_port" not in f.match_dict)
    assert service.match_dict == {"eth_type": 0x0800, "ip_proto": 17, "ipv4_dst": "10.1.255.1", "udp_dst": 27182}
    assert service.action == ("rewrite", h3.mac, h3.ip, h3.leaf_port)
    assert service.priority > 500                          # above the host routes it overrides
    gid = min(l1.groups)
    assert gid >= steering.GROUP_BASE
    assert l1.groups[gid].buckets == (steering.Rewrite(h1.mac, h1.ip, h1.leaf_port),
                                      steering.Rewrite(h2.mac, h2.ip, h2.leaf_port))
    assert any(f.action == ("group", gid) and f.match_dict == {"eth_type": 0x0800, "ipv4_dst": "10.1.254.1"}
               for f in l1.flows)
    (route,) = states["l2"].flows
    assert route.action == ("output", 4) and route.match_dict["ipv4_dst"] == "10.1.255.1"
    assert steering.arp_addresses(_plan()) == {"10.1.255.1": "l1", "10.1.254.1": "l1"}


def test_hairpins_leave_by_in_port_which_a_plain_output_cannot():
    """A packet from the server's own port to the service (a spine steering leaf 1's traffic to a
    server behind leaf 1), or a group copy back towards the sender's port, needs OpenFlow IN_PORT."""
    l1 = steering.steering_state(FABRIC, _plan())["l1"]
    h1, h2, h3 = _port("h1"), _port("h2"), _port("h3")
    (hairpin,) = [f for f in l1.flows if f.match_dict.get("in_port") == h3.leaf_port]
    assert hairpin.priority > steering.PRIO_STEER and hairpin.match_dict["udp_dst"] == 27182
    assert hairpin.action == ("rewrite", h3.mac, h3.ip, steering.IN_PORT)
    twins = {f.match_dict["in_port"]: l1.groups[f.action[1]] for f in l1.flows
             if f.action[0] == "group" and "in_port" in f.match_dict}
    assert twins[h1.leaf_port].buckets == (steering.Rewrite(h1.mac, h1.ip, steering.IN_PORT),
                                           steering.Rewrite(h2.mac, h2.ip, h2.leaf_port))
    assert twins[h2.leaf_port].buckets == (steering.Rewrite(h1.mac, h1.ip, h1.leaf_port),
                                           steering.Rewrite(h2.mac, h2.ip, steering.IN_PORT))


def test_merging_keeps_routing_and_does_not_touch_the_apps_states():
    desired = EcmpRouting(FABRIC).desired()
    before = {name: (set(s.flows), dict(s.groups)) for name, s in desired.items()}
    out = steering.merged(desired, steering.steering_state(FABRIC, _plan()))
    assert {name: (set(s.flows), dict(s.groups)) for name, s in desired.items()} == before
    assert out["l1"].flows > desired["l1"].flows and set(out["l1"].groups) > set(desired["l1"].groups)
    assert out["s1"] is desired["s1"]
    # Removing the plan takes exactly the steering entries away again.
    ops = diff(out["l1"], desired["l1"])
    kinds = sorted(op[0] for op in ops)
    assert kinds == ["flow_del"] * 5 + ["group_del"] * 3      # service, group and their hairpin twins


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p["services"][0].update(switch="l9"), "no switch 'l9'"),
    (lambda p: p["services"][0].update(address="10.1.300.1"), "not an IPv4 address"),
    (lambda p: p["services"][0].update(udp_dst=0), "udp_dst must be a port number"),
    (lambda p: p["services"][0]["to"].update(via=99), "l1 has no port 99"),
    (lambda p: p["services"][0]["to"].pop("mac"), "needs mac, ip and via"),
    (lambda p: p["groups"][0].update(members=[]), "a group needs members"),
    (lambda p: p["groups"][0].update(address="10.1.255.1"), "already steered on l1 by steering services[0]"),
    (lambda p: p["routes"][0].update(via=77), "l2 has no port 77"),
])
def test_bad_plans_are_refused_with_the_entry_named(mutate, message):
    plan = _plan()
    mutate(plan)
    with pytest.raises(steering.SteeringError, match=message.replace("[", r"\[").replace("]", r"\]")):
        steering.steering_state(FABRIC, plan)


def test_translation_to_openflow_rewrites_then_outputs():
    dp = types.SimpleNamespace(ofproto=ofp, ofproto_parser=parser)
    states = steering.steering_state(FABRIC, _plan())
    ops = diff(steering.SwitchState(), states["l1"])
    messages = [m for op in ops for m in openflow.messages(dp, op)]
    group_mods = [m for m in messages if isinstance(m, parser.OFPGroupMod)]
    assert len(group_mods) == 3 and all(m.type == ofp.OFPGT_ALL and len(m.buckets) == 2 for m in group_mods)
    group_mod = min(group_mods, key=lambda m: m.group_id)
    ports = sorted(b.actions[-1].port for m in group_mods for b in m.buckets)
    assert ports.count(ofp.OFPP_IN_PORT) == 2
    h1 = _port("h1")
    fields = [(a.key, a.value) for a in group_mod.buckets[0].actions if isinstance(a, parser.OFPActionSetField)]
    assert fields == [("eth_dst", h1.mac), ("ipv4_dst", h1.ip)]
    assert group_mod.buckets[0].actions[-1].port == h1.leaf_port
    service = next(m for m in messages if isinstance(m, parser.OFPFlowMod)
                   and "udp_dst" in dict(m.match.items()) and "in_port" not in dict(m.match.items()))
    actions = service.instructions[0].actions
    assert [type(a).__name__ for a in actions] == ["OFPActionSetField", "OFPActionSetField", "OFPActionOutput"]
    assert actions[-1].port == _port("h3").leaf_port
    for m in messages:                                     # every message encodes
        m.serialize()
