"""The plane load balancer in the udp agent's RNIC: two ranks with four plane ports each, joined
by an in-memory wire that carries their real RoCEv2 datagrams with a delay per plane, on a
made-up clock. Each mode's split with a plane slowed, congested, deep or failed; failure found
by the port, by probes and by software's timeout; the plane's return."""

import errno
import os
import random
import socket
import struct
import time
from collections import Counter, deque
from types import SimpleNamespace

import pytest

from fabriclab.traffic import agent, cc, collective, rank_driver, roce, schedules, sockets
from fabriclab.traffic.rank_driver import PeerError
from tests.unit.fakesockets import Listener, RawSocket, rank_drivers

PLANES = 4
RATE = 100.0                 # Mbit/s per plane port
PAYLOAD = 1024


def address(rank, plane):
    return f"10.{plane + 1}.0.{rank + 1}"


class Wire:
    """Datagrams between the ranks' plane ports, each delivered `delay[plane]` seconds after it
    was sent. `local_down`: source addresses whose sends fail (the NIC's own port is down);
    `dead`: addresses whose packets vanish (a failure the sender cannot see); `marked`: planes
    whose data packets arrive CE-marked; `deep`: queued bytes a port reports."""

    def __init__(self, clock):
        self.clock = clock
        self.inboxes = {address(r, p): deque() for r in range(2) for p in range(PLANES)}
        self.in_flight = []
        self.delay = [0.0] * PLANES
        self.local_down, self.dead = set(), set()
        self.marked = {}               # plane -> every how many of its data packets is marked
        self.deep = {}
        self.data = Counter()          # data packets carried, by (source rank, plane)

    def carry(self, packet):
        src, dst = socket.inet_ntoa(packet[12:16]), socket.inet_ntoa(packet[16:20])
        if src in self.local_down:
            raise OSError(errno.EHOSTUNREACH, os.strerror(errno.EHOSTUNREACH))
        plane = int(src.split(".")[1]) - 1
        sport, = struct.unpack_from("!H", packet, 20)
        payload = packet[roce.IPV4_HEADER_LEN + roce.UDP_HEADER_LEN:]
        tos = packet[1]
        if roce.parse_bth(payload).opcode in roce.RETH_OPCODES | {
                roce.OP_RC_RDMA_WRITE_MIDDLE, roce.OP_RC_RDMA_WRITE_LAST_WITH_IMMEDIATE}:
            key = (int(src.split(".")[3]) - 1, plane)
            self.data[key] += 1
            if plane in self.marked and self.data[key] % self.marked[plane] == 0:
                tos |= roce.ECN_CE
        if src in self.dead or dst in self.dead:
            return
        self.in_flight.append((self.clock.now + self.delay[plane], dst, (payload, tos, (src, sport))))

    def deliver(self, now):
        keep = []
        for item in self.in_flight:
            if item[0] <= now:
                self.inboxes[item[1]].append(item[2])
            else:
                keep.append(item)
        self.in_flight = keep


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def configs(mode, size, rates=(RATE,) * PLANES, collective_="allreduce", cc_kind="dcqcn",
            **plb_options):
    schedule = schedules.build(collective_, 2, size)
    ranks = [collective.Rank(r, f"h{r + 1}", 0,
                             [SimpleNamespace(ip=address(r, p), intf=None) for p in range(PLANES)])
             for r in range(2)]
    spec = collective.CollectiveSpec(collective_, sizes=(size,), plb=mode)
    qps = collective.plan_qps(ranks, [schedule], spec, random.Random(3))
    transport = {"payload_bytes": PAYLOAD, "chunk_bytes": 16384, "qp_method": "round-robin",
                 "ack_every": 4, "spray": 1, "ack_timeout_s": 0.05, "retry_limit": 7,
                 "dscp": 26, "control_dscp": 46, "cnp_dscp": 48, "ecn": roce.ECN_ECT0,
                 "cts": {"enabled": False}, "cc_kind": cc_kind, "qp_cc": None, "nic_queue_bytes": None,
                 "plb": {"mode": mode, "probe_interval_s": 0.01, "probe_timeouts": 3,
                         "sw_timeout_s": 0.1, "egress_room_bytes": 5000,
                         "cc": cc.kind(cc_kind).scaled(RATE, 1000.0, {}).to_dict(), **plb_options}}
    table = [{"rank": r.rank, "host": r.host, "addresses": [p.ip for p in r.ports]} for r in ranks]
    coll = {"collective": collective_, "algorithm": schedule.algorithm, "channels": 1,
            "piece_bytes": 65536, "imbalance": 4.0, "seed": 1, "root": 0}
    return schedule, [{"rank": r.rank, "ranks": table, "qps": qps[r.rank],
                       "ports": [{"address": p.ip, "rate_mbps": rates[i], "intf": None}
                                 for i, p in enumerate(r.ports)],
                       "transport": transport, "collective": coll, "sizes": [size],
                       "verify": True, "data_seed": 5, "control": "unused"} for r in ranks]


@pytest.fixture
def lab(monkeypatch):
    """make(mode, size, rates=..., **plb options) -> (wire, clock, drivers) on a fake clock."""
    clock = Clock()
    wire = Wire(clock)
    monkeypatch.setattr(sockets, "open_raw_sender", lambda src, *a, **k: RawSocket(wire, src))
    monkeypatch.setattr(sockets, "open_roce_listener",
                        lambda address_="0.0.0.0", **k: Listener(wire, address_))
    monkeypatch.setattr(sockets, "queued_bytes", lambda sock: sock.queued())
    monkeypatch.setattr(rank_driver, "ControlChannel", lambda path: None)
    monkeypatch.setattr(agent, "time", SimpleNamespace(monotonic=clock))

    def make(mode, size=1 << 20, **kw):
        _schedule, cfgs = configs(mode, size, **kw)
        return wire, clock, rank_drivers(cfgs, agent.UdpRnic)
    return make


def run(wire, clock, drivers, iteration=0, seconds=3.0, step=0.0002, at=None):
    """One iteration on both ranks on the fake clock; `at`: {time after start: callable} to
    change the wire mid-run. Returns the done reports and the iteration's start."""
    start = clock.now
    events = sorted((at or {}).items())
    for driver in drivers:
        driver.prepare(0)
        driver.run(iteration, time.time())
        driver.start_mono = start
    while clock.now < start + seconds:
        while events and clock.now >= start + events[0][0]:
            events.pop(0)[1]()
        wire.deliver(clock.now)
        for driver in drivers:
            now = clock.now
            if driver.start_mono is not None and now >= driver.start_mono:
                driver.begin(now)
            driver.rnic.poll(now)
            for plane in driver.rnic.planes:
                driver.rnic.receive(plane, now)
        done = [[m for m in d.told if m.get("done") == iteration] for d in drivers]
        if all(done):
            return [d[0] for d in done], start
        clock.now = round(clock.now + step, 7)
    pytest.fail(f"not done: {[d.status() for d in drivers]}")


def shares(report):
    sent = report["plane_tx_bytes"]
    return [b / sum(sent) for b in sent]


def cct(report):
    return report["end"] - report["start"]


MODES = ("per-plane", "global", "static", "software", "esr")


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_runs_a_verified_allreduce_over_four_healthy_planes(lab, mode):
    wire, clock, drivers = lab(mode)
    reports, _start = run(wire, clock, drivers)
    for report in reports:
        assert report["verify"]["ok"], report
        assert all(0.18 < s < 0.32 for s in shares(report)), (mode, shares(report))
        assert report["counters"]["retransmitted_packets"] == 0
    final = drivers[0].final()
    multipath = mode in ("per-plane", "global", "esr")
    # one QP per connection sends on every plane, or one per plane
    assert len(final["qps"]) == (1 if multipath else PLANES)
    assert {q["plane"] for q in final["qps"]} == ({None} if multipath else {1, 2, 3, 4})
    assert final["plb"]["mode"] == mode and final["plb"]["events"] == []
    assert [p["plane"] for p in final["plb"]["planes"]] == [1, 2, 3, 4]


def test_out_of_order_arrivals_across_planes_are_placed_without_go_back_n(lab):
    wire, clock, drivers = lab("per-plane")
    wire.delay = [0.0, 0.0005, 0.001, 0.002]           # planes of different lengths
    reports, _start = run(wire, clock, drivers)
    assert all(r["verify"]["ok"] for r in reports)
    c = reports[1]["counters"]
    assert c["out_of_sequence"] > 50 and c["reorder_depth_sum"] >= c["out_of_sequence"]
    assert c["packet_seq_err"] == 0 and c["duplicate_request"] == 0
    assert sum(r["counters"]["retransmitted_packets"] for r in reports) == 0
    reorder = drivers[1].final()["plb"]["reorder"]
    assert reorder["depth_max"] > 1 and reorder["depth_mean"] > 1
    # the in-order transport on the same wire pays for it (it NAKs and goes back N)
    wire, clock, drivers = lab("static")
    wire.delay = [0.0, 0.0005, 0.001, 0.002]
    reports, _start = run(wire, clock, drivers)
    assert sum(r["counters"]["out_of_sequence"] for r in reports) == 0      # one plane per QP


@pytest.mark.parametrize("mode, slow_share", [("per-plane", (0.0, 0.12)), ("global", (0.0, 0.12)),
                                              ("static", (0.22, 0.28)), ("esr", (0.22, 0.28))])
def test_a_slow_plane_takes_less_only_where_the_local_queue_decides(lab, mode, slow_share):
    """Plane 3's port at a quarter of the rate: the per-packet modes send where the egress queue
    frees first; the static split and ESR's entropies give it its even share anyway."""
    wire, clock, drivers = lab(mode, rates=(RATE, RATE, RATE / 4, RATE))
    reports, _start = run(wire, clock, drivers)
    assert all(r["verify"]["ok"] for r in reports)
    low, high = slow_share
    assert low <= shares(reports[0])[2] <= high, (mode, shares(reports[0]))


def test_the_choice_follows_the_fastest_queue_and_costs_static_its_completion_time(lab):
    results = {}
    for mode in ("per-plane", "static"):
        wire, clock, drivers = lab(mode, rates=(RATE, RATE, RATE / 4, RATE))
        reports, _start = run(wire, clock, drivers)
        results[mode] = max(cct(r) for r in reports)
    # static waits for the slow plane's quarter of the bytes; per-plane uses 3.25 planes' worth
    assert results["per-plane"] < 0.6 * results["static"], results


def test_a_deep_egress_queue_takes_no_packets(lab):
    wire, clock, drivers = lab("per-plane")
    wire.deep[address(0, 1)] = 10 ** 6                 # rank 0's plane 2 queue is held (a pause)
    reports, _start = run(wire, clock, drivers)
    assert all(r["verify"]["ok"] for r in reports)
    assert shares(reports[0])[1] == 0 and shares(reports[1])[1] > 0.18
    assert drivers[0].final()["plb"]["planes"][1]["deep_queue_skips"] > 0


def test_per_plane_cc_steers_away_from_a_congested_plane_global_cc_slows_them_all(lab):
    """Plane 2's data arrives CE-marked: per-plane cuts only plane 2's allowance and the
    others carry the rest; the global context is cut for every plane."""
    out = {}
    for mode in ("per-plane", "global"):
        wire, clock, drivers = lab(mode, size=4 << 20)
        wire.marked[1] = 8
        reports, _start = run(wire, clock, drivers)
        assert all(r["verify"]["ok"] for r in reports)
        dest = drivers[0].final()["plb"]["destinations"][0]
        out[mode] = (shares(reports[0]), max(cct(r) for r in reports), dest)
    share, per_plane_cct, dest = out["per-plane"]
    rates = [p["cc"]["min_rate_mbps"] for p in dest["planes"]]
    assert rates[1] < RATE and rates[0] == rates[2] == rates[3] == RATE
    assert share[1] < 0.2 < min(share[0], share[2], share[3])
    _share, global_cct, dest = out["global"]
    assert dest["cc"]["cnps"] > 0 and dest["cc"]["min_rate_mbps"] < PLANES * RATE
    assert per_plane_cct < global_cct


def test_spx_per_plane_contexts_probe_rtt_and_only_the_marked_plane_slows(lab):
    """SPX CC in the plane load balancer: every context sends RTT probes on its plane and takes
    the echoes' samples; plane 2's marks cut only its context. The global context's one rate is
    cut for all (and probes the planes in turn)."""
    out = {}
    for mode in ("per-plane", "global"):
        wire, clock, drivers = lab(mode, size=4 << 20, cc_kind="spx")
        wire.delay = [0.001, 0.001, 0.001, 0.001]
        wire.marked[1] = 8
        reports, _start = run(wire, clock, drivers)
        assert all(r["verify"]["ok"] for r in reports)
        final = drivers[0].final()["plb"]
        out[mode] = (shares(reports[0]), max(cct(r) for r in reports), final["destinations"][0],
                     final["planes"])
    share, per_plane_cct, dest, sent = out["per-plane"]
    rates = [p["cc"]["min_rate_mbps"] for p in dest["planes"]]
    assert rates[1] < RATE and rates[0] == rates[2] == rates[3] == RATE
    assert share[1] < 0.2 < min(share[0], share[2], share[3])
    for p in dest["planes"]:
        probes = p["cc"]["rtt_probes"]
        assert probes["echoes"] > 0 and p["cc"]["rtt_samples"] == probes["echoes"]
        assert probes["rtt_ms"]["min"] >= 2.0            # 1 ms each way on the wire
    # at most one probe per agent.RTT_PROBE_PACKETS data packets of the context's plane
    for p, row in zip(dest["planes"], sent):
        assert p["cc"]["rtt_probes"]["probes_sent"] <= row["data_tx_packets"] / agent.RTT_PROBE_PACKETS + 1
    _share, global_cct, dest, _sent = out["global"]
    assert dest["cc"]["cnps"] > 0 and dest["cc"]["min_rate_mbps"] < PLANES * RATE
    assert dest["cc"]["rtt_probes"]["echoes"] >= PLANES
    assert per_plane_cct < global_cct


def test_esr_moves_a_marked_entropy(lab):
    wire, clock, drivers = lab("esr", size=4 << 20)
    wire.marked[1] = 8
    reports, _start = run(wire, clock, drivers)
    assert all(r["verify"]["ok"] for r in reports)
    dest = drivers[0].final()["plb"]["destinations"][0]
    assert dest["repaths"] > 0 and dest["cc"]["cnps"] > 0
    assert dest["entropies_per_plane"][1] < 4            # marked entropies left plane 2


def _removals(driver):
    return [(e["plane"], e["peer"], e["event"], e["by"]) for e in driver.final()["plb"]["events"]]


@pytest.mark.parametrize("mode", ["per-plane", "global", "esr"])
def test_a_local_port_failure_removes_the_plane_at_once_and_it_returns(lab, mode):
    wire, clock, drivers = lab(mode, size=4 << 20)
    down, up = address(0, 3), None

    def fail():
        wire.local_down.add(down)

    def repair():
        wire.local_down.discard(down)

    reports, start = run(wire, clock, drivers, at={0.02: fail, 0.06: repair})
    assert all(r["verify"]["ok"] for r in reports)
    events = drivers[0].final()["plb"]["events"]
    assert [(e["plane"], e["peer"], e["event"], e["by"]) for e in events] == [
        (4, None, "removed", "send"), (4, None, "returned", "send")]
    removed_at = events[0]["t"] - drivers[0].clock_offset
    assert start + 0.0199 <= removed_at < start + 0.022            # within a few packet times
    assert sum(r["counters"]["local_ack_timeout_err"] for r in reports) == 0


def test_a_remote_failure_is_found_by_probe_timeouts_and_ended_by_an_echo(lab):
    wire, clock, drivers = lab("per-plane", size=8 << 20)
    dead = address(1, 2)                                  # rank 1's plane 3 port, seen from rank 0

    reports, start = run(wire, clock, drivers, at={0.02: lambda: wire.dead.add(dead),
                                                   0.12: lambda: wire.dead.discard(dead)})
    assert all(r["verify"]["ok"] for r in reports)
    events = drivers[0].final()["plb"]["events"]
    assert [(e["plane"], e["peer"], e["event"], e["by"]) for e in events][:2] == [
        (3, 1, "removed", "probes"), (3, 1, "returned", "echo")]
    offset = drivers[0].clock_offset
    removed, back = events[0]["t"] - offset - start, events[1]["t"] - offset - start
    # 3 timeouts of 10 ms after the plane went silent (its ACKs stop first)
    assert 0.02 + 0.02 < removed < 0.02 + 0.06, removed
    assert 0.12 <= back < 0.12 + 0.03, back
    live = drivers[0].final()["plb"]["destinations"][0]["planes"][2]["liveness"]
    assert live["probe_timeouts"] >= 3 and live["echoes"] >= 1 and not live["removed"]


def test_software_gives_a_plane_up_only_after_its_timeout_and_takes_it_back(lab):
    wire, clock, drivers = lab("software", size=8 << 20)
    down = address(0, 3)
    reports, start = run(wire, clock, drivers, at={0.02: lambda: wire.local_down.add(down),
                                                   0.2: lambda: wire.local_down.discard(down)})
    assert all(r["verify"]["ok"] for r in reports)
    events = drivers[0].final()["plb"]["events"]
    assert [(e["plane"], e["peer"], e["event"], e["by"]) for e in events][:2] == [
        (4, 1, "removed", "timeout"), (4, 1, "returned", "echo")]
    removed = events[0]["t"] - drivers[0].clock_offset - start
    assert 0.02 + 0.1 - 0.01 <= removed < 0.02 + 0.1 + 0.02, removed     # sw_timeout_s 0.1
    # the plane-4 QP came home: its messages flowed on plane 4 again after the return
    assert drivers[0].final()["qps"][3].get("moved_to_plane") is None


def test_software_and_per_plane_in_the_same_failure(lab):
    """The failover the lab test measures on a fabric, here on the wire: per-plane's rank loses
    a few packet times, software a whole sw_timeout."""
    took = {}
    for mode in ("per-plane", "software"):
        wire, clock, drivers = lab(mode, size=8 << 20)
        reports, _start = run(wire, clock, drivers,
                              at={0.02: lambda w=wire: w.local_down.add(address(0, 0))})
        took[mode] = cct(reports[0])
    assert took["per-plane"] + 0.08 < took["software"], took


def test_static_has_nowhere_to_go_when_a_plane_fails(lab):
    wire, clock, drivers = lab("static", size=8 << 20)
    with pytest.raises(PeerError, match="retry counter exceeded"):
        run(wire, clock, drivers, at={0.02: lambda: wire.dead.add(address(1, 1))})


def test_a_lost_carrier_removes_the_plane_without_a_send_error(lab):
    wire, clock, drivers = lab("per-plane")
    rnic = drivers[0].rnic
    rnic.link_watch = object()
    rnic.by_ifindex = {7: rnic.planes[2]}
    events = [(7, False)]
    saved = sockets.read_link_events
    sockets.read_link_events = lambda _sock: [events.pop()] if events else []
    try:
        rnic.link_events(clock.now)
    finally:
        sockets.read_link_events = saved
    assert not rnic.planes[2].up and _removals(drivers[0]) == [(3, None, "removed", "carrier")]
    assert rnic.destinations[1].usable == [True, True, False, True]


def test_netlink_link_messages_say_which_port_lost_its_carrier():
    def message(kind, index, flags):
        body = struct.pack("=BxHiII", socket.AF_UNSPEC, 1, index, flags, 0xFFFFFFFF)
        return struct.pack("=IHHII", 16 + len(body), kind, 0, 0, 0) + body

    up = sockets.IFF_UP | sockets.IFF_LOWER_UP
    data = (message(sockets.RTM_NEWLINK, 5, up) + message(sockets.RTM_NEWLINK, 6, sockets.IFF_UP)
            + message(sockets.RTM_DELLINK, 7, up) + message(3, 8, up))
    assert sockets.parse_link_events(data) == [(5, True), (6, False), (7, False)]
