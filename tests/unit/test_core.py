"""The controller core without os-ken: the generation / barrier state machine behind `programmed`,
switch lifecycle, ARP answers, steering plans and the published status, on fake datapaths."""

import pytest
from os_ken.lib.packet import arp, ethernet, packet
from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from fabriclab.apps.arp import ArpResponder
from fabriclab.apps.control import AppConfig, RunFiles, SteeringPlan
from fabriclab.apps.core import ControllerCore
from fabriclab.apps.ecmp import EcmpRouting
from fabriclab.apps.steering import SERVICE_MAC
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec
from tests.unit.fakeoftable import FakeDatapath, FakeFabric

SERVICE = "10.1.255.1"


@pytest.fixture
def fab():
    return Fabric(load_spec("tiny"))       # l1, l2, s1, s2; h1 under l1, h2 under l2


def make_core(fab, published=None):
    config = AppConfig("ecmp", {"seed": 1}, fab, RunFiles("/nonexistent"), "run-1")
    return ControllerCore(config, EcmpRouting(fab), publish=(published.append if published is not None else None))


def connect_without_acks(core, fake):
    for name, dp in fake.datapaths.items():
        fake.apply(core.switch_features(dp))
        fake.apply(core.port_desc(dp, {p: (i, True) for p, i in fake.fabric.switch_ports(name).items()}))


# -- programmed --------------------------------------------------------------------------------------
def test_a_switch_connecting_is_asked_for_its_ports_before_anything_is_programmed(fab):
    core = make_core(fab)
    dp = FakeDatapath(fab.switches["l1"].dpid)
    (sent,) = core.switch_features(dp)
    assert sent[0] is dp and isinstance(sent[1], parser.OFPPortDescStatsRequest)
    assert core.programmer.generation == 0 and not core.programmed


def test_programmed_only_once_every_switch_confirmed_the_latest_generation(fab):
    core = make_core(fab)
    fake = FakeFabric(fab)
    connect_without_acks(core, fake)
    assert not core.programmed
    fake.acknowledge(core, {"l1", "l2", "s1"})
    assert not core.programmed                                 # s2 has not confirmed
    fake.acknowledge(core, {"s2"})
    assert core.programmed and core.status().programmed
    generation = core.programmer.generation
    fake.port_event(core, fab.find_link("l1", "s1")[0], False, acknowledge=False)
    assert core.programmer.generation == generation + 2 and not core.programmed   # one per end
    fake.acknowledge(core)
    assert core.programmed


def test_a_late_barrier_of_an_older_generation_does_not_count(fab):
    core = make_core(fab)
    fake = FakeFabric(fab)
    fake.connect(core)
    l1 = fake.datapaths["l1"]
    core.programmer.forget("l1")                               # its table is unknown: wiped again
    old = core.recompute()
    old_xid = [m.xid for dp, m in old if dp is l1 and isinstance(m, parser.OFPBarrierRequest)][0]
    fake.apply(old)
    fake.tables["l1"].barriers.clear()                         # its reply is still on the way ...
    core.programmer.forget("l1")
    fake.apply(core.recompute())
    fake.acknowledge(core)                                     # ... the newer one overtakes it
    assert core.programmed
    core.barrier_reply(l1, old_xid)
    assert core.programmer.synced["l1"] == core.programmer.generation and core.programmed
    assert core.barrier_reply(l1, 9999) == [] and core.programmed       # an xid never sent


def test_a_recompute_that_changes_nothing_sends_nothing_and_the_last_barrier_confirms_it(fab):
    core = make_core(fab)
    fake = FakeFabric(fab)
    connect_without_acks(core, fake)
    generation = core.programmer.generation
    assert core.recompute() == [] and core.programmer.generation == generation + 1
    assert not core.programmed                                 # the switches' last barriers are unanswered
    fake.acknowledge(core)                                     # their replies confirm the new generation too
    assert core.programmed and set(core.programmer.synced.values()) == {generation + 1}
    assert core.recompute() == [] and core.programmed          # answered already: confirmed at once
    assert set(core.programmer.synced.values()) == {generation + 2}


def test_a_reconnecting_switch_is_wiped_then_programmed_again(fab):
    core = make_core(fab)
    fake = FakeFabric(fab)
    fake.connect(core)
    before = fake.tables["l1"].snapshot()
    dp = FakeDatapath(fab.switches["l1"].dpid)                 # a new connection
    fake.datapaths["l1"] = dp
    core.switch_features(dp)
    sends = core.port_desc(dp, {p: (i, True) for p, i in fab.switch_ports("l1").items()})
    to_l1 = [m for d, m in sends if d is dp]
    assert isinstance(to_l1[0], parser.OFPFlowMod) and to_l1[0].command == ofp.OFPFC_DELETE
    assert isinstance(to_l1[1], parser.OFPGroupMod) and to_l1[1].group_id == ofp.OFPG_ALL
    assert all(isinstance(m, parser.OFPBarrierRequest) for d, m in sends if d is not dp)
    fake.apply(sends)
    fake.acknowledge(core)
    assert fake.tables["l1"].snapshot() == before and core.programmed


def test_a_disconnected_switch_is_left_alone_and_the_fabric_is_not_programmed(fab):
    core = make_core(fab)
    fake = FakeFabric(fab)
    fake.connect(core)
    s1 = fake.datapaths["s1"]
    sends = core.disconnected(s1)
    assert s1 not in {dp for dp, _m in sends}
    fake.apply(sends)
    fake.acknowledge(core)
    status = core.status()
    assert not status.programmed and "s1" not in status.connected and "s1" not in status.synced
    assert {key[2] for key in status.down_links} == {"s1"}     # its links count as down
    assert status.events[-1]["event"] == "switch_disconnected"
    # an old connection going away after the switch reconnected changes nothing
    assert core.disconnected(FakeDatapath(fab.switches["l1"].dpid)) == []


def test_a_switch_not_in_the_fabric_is_reported_and_ignored(fab):
    published = []
    core = make_core(fab, published)
    assert core.switch_features(FakeDatapath(0xBAD)) == []
    assert published[-1].unknown_dpids == (0xBAD,)
    assert core.port_desc(FakeDatapath(0xBAD), {}) == []


def test_port_changes_outside_the_fabric_or_repeated_do_not_recompute(fab):
    core = make_core(fab)
    fake = FakeFabric(fab)
    fake.connect(core)
    l1 = fake.datapaths["l1"]
    assert core.port_status(l1, 99, False) == []               # not a fabric port
    assert core.port_status(l1, 2, True) == []                 # already up
    assert core.port_status(l1, 2, False) != []


def test_switch_errors_and_handler_failures_show_in_the_status(fab):
    published = []
    core = make_core(fab, published)
    core.switch_error(FakeDatapath(fab.switches["s2"].dpid), 5, 6, 42)
    core.handler_failed("_port_desc", KeyError("x"))
    assert published[-1].switch_errors == ("s2: OpenFlow error type 5 code 6 (xid 42)",
                                           "controller: _port_desc: KeyError: 'x'")


def test_the_status_names_the_app_and_what_the_controller_sees(fab):
    published = []
    core = make_core(fab, published)
    fake = FakeFabric(fab)
    fake.connect(core)
    cut = fab.find_link("l2", "s2")[0]
    fake.port_event(core, cut, False)
    status = published[-1]
    assert (status.app, status.options, status.generation) == ("ecmp", {"seed": 1}, core.programmer.generation)
    assert status.programmed and status.connected == ("l1", "l2", "s1", "s2")
    assert status.down_links == {cut.key}
    assert [e["event"] for e in status.events[-2:]] == ["port_down", "port_down"]
    assert status.te is None and status.stage is None


# -- ARP ------------------------------------------------------------------------------------------------
def arp_request(src_mac, src_ip, dst_ip, opcode=arp.ARP_REQUEST):
    frame = packet.Packet()
    frame.add_protocol(ethernet.ethernet(dst="ff:ff:ff:ff:ff:ff", src=src_mac, ethertype=0x0806))
    frame.add_protocol(arp.arp(opcode=opcode, src_mac=src_mac, src_ip=src_ip, dst_mac="00:00:00:00:00:00",
                               dst_ip=dst_ip))
    frame.serialize()
    return bytes(frame.data)


def answered(sends):
    (dp, out), = sends
    assert isinstance(out, parser.OFPPacketOut) and out.match["in_port"] == ofp.OFPP_CONTROLLER
    reply = packet.Packet(out.data)
    return out.actions[0].port, reply.get_protocol(ethernet.ethernet), reply.get_protocol(arp.arp)


def test_arp_for_a_host_port_is_answered_out_of_the_port_it_came_in(fab):
    core = make_core(fab)
    h1, h2 = fab.hosts["h1"].ports[0], fab.hosts["h2"].ports[0]
    sends = core.packet_in(FakeDatapath(fab.switches["l1"].dpid), h1.leaf_port, arp_request(h1.mac, h1.ip, h2.ip))
    port, eth, reply = answered(sends)
    assert port == h1.leaf_port
    assert (eth.src, eth.dst) == (h2.mac, h1.mac)
    assert (reply.opcode, reply.src_mac, reply.src_ip, reply.dst_mac, reply.dst_ip) == \
        (arp.ARP_REPLY, h2.mac, h2.ip, h1.mac, h1.ip)


def test_arp_for_a_steered_address_is_answered_with_the_service_mac(fab):
    core = make_core(fab)
    h1, h2 = fab.hosts["h1"].ports[0], fab.hosts["h2"].ports[0]
    plan = {"services": [{"switch": "l1", "address": SERVICE, "udp_dst": 9,
                          "to": {"ip": h1.ip, "mac": h1.mac, "via": h1.leaf_port}}]}
    l2 = FakeDatapath(fab.switches["l2"].dpid)
    request = arp_request(h2.mac, h2.ip, SERVICE)
    assert core.packet_in(l2, h2.leaf_port, request) == []     # no plan yet
    core.steering_changed(SteeringPlan("g", plan))
    _port, _eth, reply = answered(core.packet_in(l2, h2.leaf_port, request))
    assert (reply.src_mac, reply.src_ip) == (SERVICE_MAC, SERVICE)


def test_arp_is_answered_only_within_a_plane_and_only_for_requests():
    fab = Fabric(load_spec("spectrumx_fig16"))
    responder = ArpResponder(fab)
    a, b = fab.hosts["h1"].ports[0], fab.hosts["h2"].ports[0]
    other_plane = next(p for p in fab.hosts["h2"].ports if p.plane != a.plane)
    assert responder.reply(a.leaf, arp_request(a.mac, a.ip, b.ip)) is not None
    assert responder.reply(a.leaf, arp_request(a.mac, a.ip, other_plane.ip)) is None
    assert responder.reply(a.leaf, arp_request(a.mac, a.ip, "10.9.9.9")) is None
    assert responder.reply(a.leaf, arp_request(a.mac, a.ip, b.ip, opcode=arp.ARP_REPLY)) is None
    assert responder.reply(a.leaf, b"\x00" * 60) is None
    assert responder.reply("nosuchswitch", arp_request(a.mac, a.ip, b.ip)) is None


# -- steering --------------------------------------------------------------------------------------------
def test_a_refused_plan_keeps_the_installed_one_and_says_why(fab):
    published = []
    core = make_core(fab, published)
    fake = FakeFabric(fab)
    fake.connect(core)
    h1 = fab.hosts["h1"].ports[0]
    good = {"services": [{"switch": "l1", "address": SERVICE, "udp_dst": 9,
                          "to": {"ip": h1.ip, "mac": h1.mac, "via": h1.leaf_port}}]}
    fake.apply(core.steering_changed(SteeringPlan("g1", good)))
    fake.acknowledge(core)
    installed = fake.tables["l1"].snapshot()
    assert published[-1].steering.generation == "g1" and published[-1].steering.error == ""
    assert core.steering_changed(SteeringPlan("g2", {"services": [{"switch": "l9"}]})) == []
    assert (published[-1].steering.generation, published[-1].steering.error) == \
        ("g2", "steering services[0]: no switch 'l9'")
    assert fake.tables["l1"].snapshot() == installed and core.programmed


def test_every_message_the_core_sends_encodes():
    """The fake table takes os-ken objects; the switches take bytes. TE, steering and failures
    exercise every kind of message the core sends."""
    from fabriclab.apps.te import Demand, DemandKey, TeRouting, cspf

    fab = Fabric(load_spec("default"))
    routing = TeRouting(fab)
    h1 = fab.hosts["h1"].ports[0]
    routing.placement = cspf(fab, [Demand(DemandKey("l1", h1.leaf_port, "l2"), 1.0, "test")])
    core = make_core(fab)
    core.routing = routing
    fake = FakeFabric(fab)
    fake.connect(core)
    plan = {"groups": [{"switch": "l1", "address": "10.1.254.1",
                        "members": [{"ip": h1.ip, "mac": h1.mac, "via": h1.leaf_port}]}]}
    fake.apply(core.steering_changed(SteeringPlan("g", plan)))
    fake.port_event(core, fab.find_link("l1", "s1")[0], False)
    h2 = fab.hosts["h2"].ports[0]
    fake.apply(core.packet_in(fake.datapaths["l1"], h2.leaf_port, arp_request(h2.mac, h2.ip, h1.ip)))
    kinds = {type(m).__name__ for m in fake.sent}
    assert kinds == {"OFPFlowMod", "OFPGroupMod", "OFPBarrierRequest", "OFPPortDescStatsRequest", "OFPPacketOut"}
    for msg in fake.sent:
        msg.serialize()
        assert len(msg.buf) >= 8
