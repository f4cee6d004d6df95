"""The queue model's arithmetic and wire messages, checked by hand (no network)."""

import dataclasses
import struct

import pytest

from fabriclab.errors import LabError, SpecError
from fabriclab.queues import config
from fabriclab.queues.config import (EcnProfile, PauseState, PfcSettings, QueueSpec, mark_probability,
                                     mark_threshold, pfc_thresholds, queues_from_dict, thresholds, watchdog_lab_ms)
from fabriclab.queues.gate import GATE_HANDLE, GATE_PARENT, netlink_error, tbf_change_message
from fabriclab.queues.ovsbuf import tx_socket_inodes
from fabriclab.queues.model import port_classid, port_table
from fabriclab.system.shaping import gate_settings, queued_commands
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec, spec_from_dict


# -- ECN marking ----------------------------------------------------------------------------------
def test_red_marks_nothing_below_kmin_everything_at_kmax_and_linearly_between():
    assert mark_probability(9_999, 10_000, 30_000, 0.2) == 0.0
    assert mark_probability(10_000, 10_000, 30_000, 0.2) == 0.0
    assert mark_probability(20_000, 10_000, 30_000, 0.2) == pytest.approx(0.1)
    assert mark_probability(29_999, 10_000, 30_000, 0.2) == pytest.approx(0.19999, rel=1e-4)
    assert mark_probability(30_000, 10_000, 30_000, 0.2) == 1.0


def test_step_marks_at_and_above_k_only():
    assert mark_probability(4_999, 5_000, 5_000, 1.0, "step") == 0.0
    assert mark_probability(5_000, 5_000, 5_000, 1.0, "step") == 1.0
    assert mark_probability(50_000, 5_000, 99_000, 0.1, "off") == 0.0


def test_the_data_paths_integer_threshold_matches_the_probability():
    pmax = int(0.2 * config.PROB_ONE)
    for occ in (0, 10_000, 12_345, 20_000, 29_999, 30_000, 90_000):
        expected = mark_probability(occ, 10_000, 30_000, 0.2)
        assert mark_threshold(occ, 10_000, 30_000, pmax) / config.PROB_ONE == pytest.approx(expected, abs=1e-5)


def test_default_ecn_thresholds_are_a_fifth_and_three_fifths_of_the_buffer():
    assert config.ecn_thresholds(100_000, EcnProfile()) == (20_000, 60_000)
    assert config.ecn_thresholds(100_000, EcnProfile(mode="step", kmin=7_000)) == (7_000, 7_000)


# -- PFC thresholds and hysteresis ---------------------------------------------------------------
def test_headroom_is_the_reaction_time_at_line_rate_plus_two_frames():
    # 20 Mbit/s for 5 ms = 12 500 B; two 9014-byte frames = 18 028 B
    assert config.default_headroom(20, 9000, 5.0) == 30_528
    xoff, xon, headroom = pfc_thresholds(65_536, 20, 9000, PfcSettings())
    assert (xoff, xon, headroom) == (65_536 - 30_528, 65_536 - 30_528 - 2 * 9014, 30_528)


def test_headroom_covers_the_cables_round_trip_too():
    # 20 Mbit/s for 5 ms of reaction plus 2 x 1.5 ms of cable: 20 000 B, plus two frames
    assert config.default_headroom(20, 9000, 5.0, delay_ms=1.5) == 20_000 + 18_028
    xoff, _xon, headroom = pfc_thresholds(65_536, 20, 9000, PfcSettings(), delay_ms=1.5)
    assert (xoff, headroom) == (65_536 - 38_028, 38_028)
    # an explicit headroom is the user's: the delay does not change it
    assert pfc_thresholds(65_536, 20, 9000, PfcSettings(headroom=5_000), delay_ms=1.5)[2] == 5_000


def test_a_delay_that_leaves_no_room_for_xoff_is_refused_naming_the_delay():
    problems = config.check_against_fabric(config.QueueSpec(), {"leaf": 65_536, "spine": 262_144},
                                           {"leaf": 20, "spine": 20}, 9000, delays={"leaf": 10.0, "spine": 0.0})
    assert len(problems) == 1 and "leaf buffer 65536 B" in problems[0] and "the delay" in problems[0]


def test_explicit_pfc_thresholds_win():
    assert pfc_thresholds(65_536, 20, 1500, PfcSettings(xoff=30_000, xon=10_000, headroom=5_000)) == \
        (30_000, 10_000, 5_000)


def test_pause_hysteresis_goes_off_at_xoff_and_on_at_xon_once_each():
    p = PauseState(xoff=10_000, xon=4_000)
    for _ in range(9):
        p.arrive(1_000)
    assert not p.paused
    p.arrive(1_000)
    assert p.paused and p.events == [("xoff", 10_000)]
    p.arrive(1_000)                          # more bytes while paused: no second XOFF
    for _ in range(6):
        p.depart(1_000)
    assert p.paused                          # 5 000 held, still above XON
    p.depart(1_000)
    assert not p.paused and p.events == [("xoff", 10_000), ("xon", 4_000)]
    with pytest.raises(ValueError):
        PauseState(xoff=100, xon=100)


def test_thresholds_per_class():
    spec = QueueSpec()
    lossless = thresholds(spec, "leaf", config.LOSSLESS, 65_536, 20, 9000)
    assert lossless.pfc and lossless.xoff == 35_008 and lossless.headroom_limit == 65_536
    assert lossless.ecn_mode == 1 and lossless.kmin == 13_107
    control = thresholds(spec, "leaf", config.CONTROL, 65_536, 20, 9000)
    assert not control.pfc and control.ecn_mode == 0 and control.limit == 65_536
    lossy = thresholds(QueueSpec(pfc=PfcSettings(enabled=False)), "leaf", config.LOSSLESS, 65_536, 20, 9000)
    assert not lossy.pfc and lossy.xoff == 0


def test_dscp_table():
    table = QueueSpec(lossless_dscp=(3, 26), control_dscp=(48,)).dscp_classes()
    assert len(table) == 64
    assert table[26] == table[3] == config.LOSSLESS and table[48] == config.CONTROL and table[0] == config.LOSSY


# -- the spec section ----------------------------------------------------------------------------
def test_queues_section_parses_with_role_overrides():
    spec = queues_from_dict({"classes": {"lossless": [26, 24], "control": 48},
                             "ecn": {"kmin": "10KiB", "kmax": "40KiB", "pmax": 0.5,
                                     "spine": {"kmin": "100KiB", "kmax": "200KiB"}},
                             "pfc": {"reaction_ms": 2, "watchdog_ms": 0, "watchdog_action": "forward"}})
    assert spec.lossless_dscp == (24, 26) and spec.control_dscp == (48,)
    assert spec.ecn_for("leaf") == EcnProfile("red", 10_240, 40_960, 0.5)
    assert spec.ecn_for("spine") == EcnProfile("red", 102_400, 204_800, 0.5)
    assert spec.pfc.watchdog_ms == 0 and spec.pfc.watchdog_action == "forward"
    assert QueueSpec.from_dict(spec.to_dict()) == spec
    assert queues_from_dict(True) == QueueSpec()
    assert queues_from_dict({"ecn": "off", "pfc": "off"}).pfc.enabled is False


@pytest.mark.parametrize("section, message", [
    ({"ecn": {"kmin": "50KiB", "kmax": "10KiB"}}, "kmax (10240) must be >= kmin"),
    ({"ecn": {"mode": "wred"}}, "mode: must be one of red, step, off, ar"),
    ({"ecn": {"pmax": 0}}, "pmax: must be > 0"),
    ({"pfc": {"xoff": 1000, "xon": 2000}}, "xon (2000) must be below xoff (1000)"),
    ({"pfc": {"watchdog_action": "reboot"}}, "watchdog_action: must be one of drop, forward"),
    ({"pfc": {"reaction_ms": 0}}, "reaction_ms: must be > 0"),
    ({"pfc": {"watchdog_ms": "fast"}}, "watchdog_ms: must be lab milliseconds (>= 0, 0: off) or 'real'"),
    ({"pfc": {"watchdog_ms": -1}}, "watchdog_ms: must be >= 0"),
    ({"classes": {"lossless": [26], "control": [26]}}, "DSCP 26 is in both"),
    ({"classes": {"lossless": [64]}}, "DSCP values are 0..63"),
    ({"classes": {"bulk": [8]}}, "unknown class 'bulk'"),
    ({"buffers": 1}, "unknown key 'buffers'"),
    ("yes", "must be a mapping"),
])
def test_bad_queue_sections_are_one_line_errors(section, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        queues_from_dict(section)


def test_the_default_watchdog_is_a_switchs_200_ms_of_real_time_at_the_time_scale():
    assert PfcSettings().watchdog_ms is None
    assert queues_from_dict({"pfc": {"watchdog_ms": "real"}}).pfc.watchdog_ms is None
    assert watchdog_lab_ms(PfcSettings(), 40_000) == 200.0 * 40_000     # 8000 s of lab time
    assert watchdog_lab_ms(PfcSettings(), None) == 200.0                # no time scale stated
    assert watchdog_lab_ms(PfcSettings(watchdog_ms=300), 40_000) == 300  # set: lab ms, as given
    assert watchdog_lab_ms(PfcSettings(watchdog_ms=0), 40_000) == 0      # off


def test_a_buffer_too_small_for_the_headroom_is_refused_with_the_numbers():
    data = {"name": "q", "host_rate": "20Mbit", "fabric_rate": "20Mbit", "queues": {"pfc": {"reaction_ms": 50}}}
    with pytest.raises(SpecError, match=r"leaf buffer 65536 B leaves XOFF at -77492 B after 143028 B of headroom.* grow buffers.leaf"):
        spec_from_dict(data)


def test_fabric_json_keeps_the_queue_spec():
    spec = spec_from_dict({"name": "q", "queues": {"ecn": {"mode": "step", "kmin": "20KiB"}}})
    assert Fabric.from_json(Fabric(spec).to_json()).spec.queues == spec.queues


# -- tc and netlink ------------------------------------------------------------------------------
def test_queued_tree_has_strict_priority_control_and_a_pause_gate():
    cmds = [" ".join(c) for c in queued_commands("x-eth1", 20, 65_536, 9000)]
    assert "htb default 30" in cmds[0]
    assert any("classid 1:20 htb" in c and "prio 0" in c for c in cmds)
    assert any("classid 1:10 htb" in c and "prio 1" in c for c in cmds)
    assert any("parent 1:10 handle 10: tbf rate 200000000bit" in c for c in cmds)
    assert any("parent 1:30 handle 30: bfifo limit 83564" in c for c in cmds)
    assert gate_settings(20, 9000) == (25_000_000, 72_112, 9014, 64 * 2**20)


def test_tbf_change_message_layout():
    msg = tbf_change_message(7, ifindex=5, rate_bytes_s=1, burst=9014, limit=1 << 20)
    length, kind, flags, seq, _ = struct.unpack_from("=IHHII", msg)
    assert (length, kind, flags, seq) == (len(msg), 36, 0x5, 7)
    family, ifindex, handle, parent = struct.unpack_from("=BxHiII", msg, 16)[0], *struct.unpack_from("=iII", msg, 20)
    assert (ifindex, handle, parent) == (5, GATE_HANDLE, GATE_PARENT) and GATE_HANDLE == 0x100000
    assert b"tbf\0" in msg
    qopt = msg.index(struct.pack("=BBHhHI", 0, 1, 0, 0, 0, 1))     # rate 1 B/s, link layer ethernet
    assert struct.unpack_from("=I", msg, qopt + 24)[0] == 1 << 20     # the fifo limit after two ratespecs
    assert struct.pack("=HHI", 8, 6, 9014) in msg                      # TCA_TBF_BURST
    big = tbf_change_message(1, 5, 5 * 2**32, 65_536, 1)
    assert struct.pack("=HHQ", 12, 4, 5 * 2**32) in big               # TCA_TBF_RATE64 past 32 bits


def test_netlink_ack_parsing():
    ack = struct.pack("=IHHII", 36, 2, 0, 9, 0) + struct.pack("=i", -19) + bytes(16)
    assert netlink_error(ack, 9) == 19
    assert netlink_error(ack, 8) is None
    ok = struct.pack("=IHHII", 36, 2, 0, 3, 0) + struct.pack("=i", 0) + bytes(16)
    assert netlink_error(ok, 3) == 0


def test_send_only_packet_sockets_are_found_in_proc_net_packet(tmp_path):
    table = tmp_path / "packet"
    table.write_text("sk       RefCnt Type Proto  Iface R Rmem   User   Inode\n"
                     "ffff0001 3      3    0003   7     1 0      0      111\n"
                     "ffff0002 3      3    0000   0     0 0      0      222\n"
                     "ffff0003 3      3    0000   4     0 0      0      333\n")
    assert tx_socket_inodes(str(table)) == {"222"}


# -- ports ---------------------------------------------------------------------------------------
def test_port_table_pairs_both_ends_of_every_cable():
    fabric = Fabric(load_spec("tiny"))
    ports = port_table(fabric)
    assert len(ports) == 2 * len(fabric.links)
    for p in ports:
        peer = ports[p.peer]
        assert peer.peer == p.idx and {p.node, peer.node} <= {*fabric.switches, *fabric.hosts}
    host = next(p for p in ports if p.role == "host")
    assert ports[host.peer].role == "leaf" and host.buffer == fabric.spec.buffers.host
    assert port_classid(0) == "fab:1" and port_classid(30) == "fab:1f"


def test_a_relay_that_leaves_no_room_for_xoff_is_refused_before_anything_starts():
    # The relay to another machine is known only at start (4x the measured round trip, at least
    # 2 ms); at 5 Mbit/s a 64 KiB leaf buffer with a 40 ms reaction keeps XOFF above two frames
    # with a 2 ms relay (20008 B), not a 20 ms one (-2492 B, which the data path's field wrapped).
    import dataclasses

    from fabriclab.queues.model import check_relay_headroom
    from fabriclab.topologies.spec import Buffers, FabricSpec

    spec = FabricSpec(name="t", leaves=2, spines=2, hosts_per_leaf=2, host_rate_mbps=5, fabric_rate_mbps=5,
                      buffers=Buffers(leaf=64 << 10, spine=64 << 10),
                      queues=QueueSpec(pfc=PfcSettings(reaction_ms=40)))
    fabric = Fabric(spec)
    placement = {n: ("a" if n in ("l1", "s1", "s2", "h1", "h2") else "b") for n in (*fabric.switches, *fabric.hosts)}
    check_relay_headroom(port_table(fabric, placement, 2.0), spec.queues, spec.mtu)
    with pytest.raises(LabError, match=r"^queues.pfc: l2-eth\d is cabled to another machine; the 20 ms .* "
                                       r"leaves XOFF at -2492 B of its 65536 B buffer: grow buffers.leaf"):
        check_relay_headroom(port_table(fabric, placement, 20.0), spec.queues, spec.mtu)
    # ports on one machine, and a lossy fabric, have nothing to relay
    check_relay_headroom(port_table(fabric, None, 30.0), spec.queues, spec.mtu)
    lossy = dataclasses.replace(spec.queues, pfc=PfcSettings(enabled=False))
    check_relay_headroom(port_table(fabric, placement, 30.0), lossy, spec.mtu)


def test_pfc_reaction_time_is_measured_from_the_xoff():
    from fabriclab.queues.datapath import EV_XOFF, EV_XON, Event
    from fabriclab.queues.pfc import PfcAgent

    class FakeGates:
        def set(self, *args, **kw):
            pass

    now = [50_000_000]
    ports = {0: object()}
    agent = PfcAgent(None, ports, FakeGates(), PfcSettings(watchdog_ms=0), clock=lambda: now[0])
    agent._apply = lambda idx, st, t: now.__setitem__(0, now[0] + 500_000)    # each gate change: 0.5 ms
    for ts in (49_000_000, 47_000_000, 45_000_000):        # 1, 3.5 and 6 ms before the agent has them
        agent._on_event(Event(EV_XOFF, 1, 0, 0, ts, 0))
    agent._on_event(Event(EV_XON, 1, 0, 0, 1, 0))            # XONs are not reactions
    assert agent.reaction_stats() == {"pauses": 3, "p50_ms": 4.0, "p99_ms": 6.5, "max_ms": 6.5,
                                      "max_wait_ms": 6.0, "max_gate_change_ms": 0.5}
    assert agent.reaction_stats(since_ns=46_000_000) == {"pauses": 2, "p50_ms": 4.0, "p99_ms": 4.0,
                                                         "max_ms": 4.0, "max_wait_ms": 3.5,
                                                         "max_gate_change_ms": 0.5}
    assert agent.reaction_stats(since_ns=60_000_000) == {"pauses": 0}


def test_only_the_lossless_class_waits_four_drains_before_it_times_out():
    from fabriclab.traffic.collective import default_ack_timeout, path_drain_s

    fabric = Fabric(load_spec("incast"))          # PFC on, DSCP 26 lossless
    drain = path_drain_s(fabric)                   # (64 + 2 x 96 + 1536) KiB at 10 Mbit/s
    assert drain == pytest.approx(1792 * 1024 * 8 / 10e6)
    assert default_ack_timeout(fabric) == round(8 * drain + 0.05, 3)
    assert default_ack_timeout(fabric, dscp=26) == default_ack_timeout(fabric)
    # a job in the lossy class is tail-dropped: it recovers like one on a fabric without PFC
    assert default_ack_timeout(fabric, dscp=0) == round(2 * drain + 0.05, 3)
    without_queues = Fabric(dataclasses.replace(load_spec("incast"), queues=None))
    assert default_ack_timeout(without_queues, dscp=26) == default_ack_timeout(fabric, dscp=0)
