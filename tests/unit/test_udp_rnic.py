"""The udp agent's RNIC under the rank driver, with its raw sockets swapped for an in-memory
wire that carries the agent's real RoCEv2 datagrams: RC writes with ACKs, go-back-N after a
loss, CTS grants, CNPs for CE marks, and the error a fatal send gives."""

import errno
import os
import socket
import struct
import time
from collections import deque

import pytest

from fabriclab.errors import LabError
from fabriclab.traffic import agent, rank_driver, roce, schedules, sockets
from tests.unit.fakesockets import Listener, RawSocket, rank_drivers

ADDRESSES = ["10.0.0.1", "10.0.0.2"]


class Wire:
    """Datagrams between the agents' sockets: what one raw socket sends lands in the listener
    of its destination address, as the kernel would hand it over (UDP payload, TOS, source).
    `drop(n)` says whether the n-th data packet is lost; `mark(n)` whether it is CE-marked;
    `late(n)` whether it arrives after the next data packet (another path was faster)."""

    def __init__(self, drop=lambda n: False, mark=lambda n: False, late=lambda n: False):
        self.inboxes = {address: deque() for address in ADDRESSES}
        self.drop, self.mark, self.late = drop, mark, late
        self.data_packets = 0
        self.held = None               # a late packet: (inbox, datagram)
        self.refuse = []               # errnos the next sends raise

    def carry(self, packet):
        if self.refuse:
            code = self.refuse.pop(0)
            raise OSError(code, os.strerror(code))
        tos = packet[1]
        src, dst = socket.inet_ntoa(packet[12:16]), socket.inet_ntoa(packet[16:20])
        sport, = struct.unpack_from("!H", packet, 20)
        payload = packet[roce.IPV4_HEADER_LEN + roce.UDP_HEADER_LEN:]
        if roce.parse_bth(payload).opcode in roce.RETH_OPCODES | {
                roce.OP_RC_RDMA_WRITE_MIDDLE, roce.OP_RC_RDMA_WRITE_LAST_WITH_IMMEDIATE}:
            self.data_packets += 1
            if self.drop(self.data_packets):
                return
            if self.mark(self.data_packets):
                tos |= roce.ECN_CE
            held, self.held = self.held, None
            if self.late(self.data_packets):
                self.held = (self.inboxes[dst], (payload, tos, (src, sport)))
            else:
                self.inboxes[dst].append((payload, tos, (src, sport)))
            if held is not None:
                held[0].append(held[1])
            return
        self.inboxes[dst].append((payload, tos, (src, sport)))


def _configs(collective="allreduce", size=64 * 1024, in_place=False, **transport):
    schedule = schedules.build(collective, 2, size, in_place=in_place)
    qps = [[], []]
    for a, b, channel in schedule.connections():
        for me, peer, qpn, peer_qpn, send, recv in ((a, b, 0x100, 0x200, 7, 0xFFFFF0),
                                                    (b, a, 0x200, 0x100, 0xFFFFF0, 7)):
            qps[me].append({"qpn": qpn, "peer": peer, "peer_qpn": peer_qpn, "channel": channel,
                            "port": 0, "index": 0, "peer_address": ADDRESSES[peer],
                            "sport": 0xC123, "send_psn": send, "recv_psn": recv})
    transport = {"payload_bytes": 1024, "chunk_bytes": 16384, "qp_method": "round-robin",
                 "ack_every": 4, "spray": 1, "ack_timeout_s": 0.02, "retry_limit": 7,
                 "dscp": 26, "control_dscp": 46, "cnp_dscp": 48, "ecn": roce.ECN_ECT0,
                 "cts": {"enabled": False}, "cc_kind": "dcqcn", "qp_cc": None, "nic_queue_bytes": None, **transport}
    ranks = [{"rank": r, "host": f"h{r + 1}", "addresses": [ADDRESSES[r]]} for r in range(2)]
    coll = {"collective": collective, "algorithm": schedule.algorithm, "channels": 1,
            "piece_bytes": 65536, "imbalance": 4.0, "seed": 1, "root": 0}
    return schedule, [{"rank": r, "ranks": ranks, "qps": qps[r],
                       "ports": [{"address": ADDRESSES[r], "rate_mbps": 2000}],
                       "transport": transport, "collective": coll, "sizes": [size],
                       "verify": True, "data_seed": 5, "control": "unused"} for r in range(2)]


@pytest.fixture
def pair(monkeypatch):
    """Two rank drivers over UdpRnics joined by a Wire: make(wire, **transport)."""
    def make(wire, **transport):
        monkeypatch.setattr(sockets, "open_raw_sender", lambda *a, **k: RawSocket(wire))
        monkeypatch.setattr(sockets, "open_roce_listener",
                            lambda address="0.0.0.0", **k: Listener(wire, address))
        monkeypatch.setattr(rank_driver, "ControlChannel", lambda path: None)
        schedule, configs = _configs(**transport)
        return schedule, rank_drivers(configs, agent.UdpRnic)
    return make


def _iterate(drivers, iteration=0, seconds=5.0, in_place=False):
    """Run one iteration on both ranks, as their event loops would; returns the done reports."""
    start_at = time.time()
    for driver in drivers:
        driver.prepare(0, in_place)
        driver.run(iteration, start_at)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        _step(drivers)
        done = [[m for m in d.told if "done" in m] for d in drivers]
        if all(done):
            return [d[0] for d in done]
    pytest.fail(f"not done: {[d.status() for d in drivers]}")


def _step(drivers):
    """One turn of each rank's event loop."""
    for driver in drivers:
        now = time.monotonic()
        if driver.start_mono is not None and now >= driver.start_mono:
            driver.begin(now)
        driver.rnic.poll(now)
        for plane in driver.rnic.planes:
            driver.rnic.receive(plane, time.monotonic())


# Where nothing is lost, an ACK timeout could only come from this loop being descheduled (a
# loaded CI machine stalled it past 20 ms once): such tests wait a second before resending.
PATIENT = 1.0


def test_a_collective_runs_over_real_rocev2_datagrams(pair):
    wire = Wire()
    schedule, drivers = pair(wire, ack_timeout_s=PATIENT)
    reports = _iterate(drivers)
    for rank, report in enumerate(reports):
        assert report["verify"]["ok"], report
        c = report["counters"]
        assert c["tx_bytes"] == schedule.sent_bytes(rank) and c["retransmitted_packets"] == 0
        assert c["rx_bytes"] == schedule.received_bytes(rank)
        # an ACK for every 4th packet and every message's last (16 KiB messages of 1 KiB packets)
        assert c["acks_sent"] == c["rx_packets"] // 4
        assert c["enobufs"] == c["send_errors"] == 0
    final = drivers[0].final()
    assert final["ports"][0]["tx_packets"] > 0 and final["qps"][0]["first_send"] is not None


@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather"])
def test_in_place_writes_land_where_the_buffers_live(pair, collective):
    """In place the RETH addresses name the region the receive buffer lives in (the input is gone),
    and the result, read there, is numpy's."""
    wire = Wire()
    schedule, drivers = pair(wire, collective=collective, in_place=True)
    reports = _iterate(drivers, in_place=True)
    for rank, report in enumerate(reports):
        assert report["verify"]["ok"] and report["verify"]["elements"] > 0, report
        assert report["counters"]["tx_bytes"] == schedule.sent_bytes(rank)
        assert set(drivers[rank].memory.bytes) == set(schedule.regions[rank])
    assert "input" not in schedule.regions[0] or "output" not in schedule.regions[0]


def test_go_back_n_recovers_a_lost_packet(pair):
    wire = Wire(drop=lambda n: n == 10)
    _schedule, drivers = pair(wire)
    reports = _iterate(drivers)
    assert all(r["verify"]["ok"] for r in reports)
    counters = [r["counters"] for r in reports]
    assert sum(c["out_of_sequence"] for c in counters) >= 1
    assert sum(c["packet_seq_err"] for c in counters) == 1            # one NAK per gap
    assert sum(c["naks_received"] for c in counters) == 1
    assert sum(c["retransmitted_packets"] for c in counters) >= 1


def test_reordering_costs_go_back_n_unless_the_receiver_places(pair):
    """Every 7th data packet overtaken by the next (a per-packet load balancer's paths): RoCEv2's
    RC receiver NAKs each and the sender goes back N; a placing receiver writes each packet where
    its RETH says and counts it, and nothing is sent twice."""
    counters = {}
    for reorder in ("go-back-n", "place"):
        _schedule, drivers = pair(Wire(late=lambda n: n % 7 == 0), reorder=reorder, ack_timeout_s=PATIENT)
        reports = _iterate(drivers)
        assert all(r["verify"]["ok"] for r in reports), reorder
        counters[reorder] = {k: sum(r["counters"][k] for r in reports)
                             for k in ("out_of_sequence", "packet_seq_err", "retransmitted_packets")}
    assert counters["go-back-n"]["packet_seq_err"] > 0 and counters["go-back-n"]["retransmitted_packets"] > 0
    assert counters["place"]["out_of_sequence"] > 0
    assert counters["place"]["packet_seq_err"] == counters["place"]["retransmitted_packets"] == 0


def test_a_placing_receiver_naks_a_lost_packets_hole_before_the_ack_timeout(pair):
    """A loss under reorder=place: the hole outlives the reorder timeout, is NAKed, and that
    packet alone goes again; the 5 s ACK timeout never fires."""
    wire = Wire(drop=lambda n: n == 10)
    _schedule, drivers = pair(wire, reorder="place", reorder_timeout_s=0.01, ack_timeout_s=5.0)
    reports = _iterate(drivers, seconds=3.0)
    assert all(r["verify"]["ok"] for r in reports)
    c = {k: sum(r["counters"][k] for r in reports)
         for k in ("holes_naked", "packet_seq_err", "naks_received", "retransmitted_packets",
                   "local_ack_timeout_err", "duplicate_request")}
    assert c["holes_naked"] == c["packet_seq_err"] == c["naks_received"] == 1, c
    assert c["retransmitted_packets"] == 1 and c["local_ack_timeout_err"] == 0, c


def test_cts_grants_let_the_writes_through(pair):
    _schedule, drivers = pair(Wire(), cts={"enabled": True, "buffers": 1, "refresh_s": 0.01})
    reports = _iterate(drivers)
    assert all(r["verify"]["ok"] for r in reports)
    assert all(c.granted_to_me >= c.posted > 0 for d in drivers for c in d.connections.values())


def test_ce_marks_are_answered_with_cnps_that_slow_the_sender(pair):
    from fabriclab.traffic.dcqcn import DcqcnParams

    params = DcqcnParams.scaled(2000, 1.0).to_dict()
    _schedule, drivers = pair(Wire(mark=lambda n: n % 8 == 0), qp_cc=params)
    reports = _iterate(drivers)
    assert all(r["verify"]["ok"] for r in reports)
    counters = [r["counters"] for r in reports]
    assert sum(c["ce_marked"] for c in counters) > 0
    assert sum(c["cnp_sent"] for c in counters) == sum(c["cnp_handled"] for c in counters) > 0
    qp = drivers[0].final()["qps"][0]
    assert qp["dcqcn"]["min_rate_mbps"] < 2000


def test_spx_cuts_on_cnps_and_takes_rtt_samples_from_its_probes(pair):
    from fabriclab.traffic.spxcc import SpxParams

    # initial_rtt 1 ms: a cut per millisecond at most, so the marks of one burst cut once or
    # a few times. Probes time out after the probe interval: 1 s, so that a loaded machine's
    # slow turn of the loop loses none (at 5 ms, one run beside the lab's experiments did).
    params = SpxParams.scaled(2000, 1.0, initial_rtt=1000.0).to_dict()
    _schedule, drivers = pair(Wire(mark=lambda n: n % 8 == 0), cc_kind="spx", qp_cc=params,
                              plb={"mode": "static", "probe_interval_s": 1.0})
    for driver in drivers:
        driver.rnic.timer_period = 0.001      # RTT probes go from the timer
    reports = _iterate(drivers, seconds=10.0)
    assert all(r["verify"]["ok"] for r in reports)
    for _ in range(50):                       # CNPs and echoes still on the wire arrive
        _step(drivers)
    counters = [d.final()["totals"] for d in drivers]
    assert sum(c["cnp_sent"] for c in counters) == sum(c["cnp_handled"] for c in counters) > 0
    qp = drivers[0].final()["qps"][0]
    assert "dcqcn" not in qp
    spx = qp["spx"]
    assert spx["cnps"] > 0 and spx["rate_decreases"] > 0 and spx["min_rate_mbps"] < 2000
    # its probes were echoed by the peer and gave samples
    assert spx["rtt_probes"]["echoes"] > 0 and spx["rtt_samples"] == spx["rtt_probes"]["echoes"]


def test_a_fatal_send_error_names_the_port_and_the_peer(pair):
    wire = Wire()
    _schedule, drivers = pair(wire)
    wire.refuse = [errno.ENOBUFS, errno.EMSGSIZE]
    drivers[0].prepare(0)
    drivers[0].run(0, time.time())
    drivers[0].begin(time.monotonic())
    drivers[0].rnic.poll(time.monotonic())                     # ENOBUFS: held, counted
    assert drivers[0].rnic.totals()["enobufs"] == 1
    time.sleep(0.001)
    with pytest.raises(LabError, match=r"10\.0\.0\.1 towards rank 1 \(h2 10\.0\.0\.2\): a \d+-byte "
                                       r"packet exceeds the MTU towards 10\.0\.0\.2") as err:
        drivers[0].rnic.poll(time.monotonic())
    assert "\n" not in str(err.value)


def test_a_stalled_collective_is_explained_by_the_sender_that_holds_it_up(pair):
    """Every data packet lost: each rank waits for the other, and each one's status shows the
    sends it cannot get acknowledged and the timeouts it has counted; the stall report names
    them instead of only the bytes a rank waits for."""
    from fabriclab.traffic.stall import explain_stall

    _schedule, drivers = pair(Wire(drop=lambda n: True), ack_timeout_s=0.01, retry_limit=1000)
    start_at = time.time()
    for driver in drivers:
        driver.prepare(0)
        driver.run(0, start_at)
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        _step(drivers)
    statuses = {d.rank: d.status() for d in drivers}
    sending = statuses[1]["sending"]
    assert sending and sending[0]["peer"] == 0 and sending[0]["unacked_packets"] > 0
    assert sending[0]["retries"] >= 1 and sending[0]["retransmitted_packets"] > 0
    text = explain_stall(0, statuses, lambda r: f"rank {r}")
    assert text.startswith("rank 0 waits for ") and " bytes from rank 1; rank 1 still has " in text, text
    assert "timeouts in a row" in text, text
