"""The one pacer and the one send policy of the lab's RNICs, on a made-up clock and on sockets
that refuse what a test tells them to: pacing arithmetic, turn-taking, backoffs, the errno
classes, and the generator's flows under backpressure."""

import errno
import os
import random
import socket
import threading
import time

import pytest

from fabriclab.traffic import generator, ports, roce, send_policy, sockets
from fabriclab.traffic.pacer import MAX_BURST_S, SEND_AHEAD_S, Pace, Pacer

# -- fakes ----------------------------------------------------------------------------------------


def _error(code):
    return OSError(code, os.strerror(code))


class ScriptedSocket:
    """A raw socket whose sendto raises the errors queued in `refuse` (one per call, None =
    accept), then accepts everything. Records what it accepted."""

    def __init__(self, refuse=()):
        self.refuse = list(refuse)
        self.accepted = []

    def sendto(self, data, flags, address):
        assert flags & socket.MSG_DONTWAIT
        code = self.refuse.pop(0) if self.refuse else None
        if code is not None:
            raise _error(code)
        self.accepted.append((bytes(data), address[0]))
        return len(data)

    def close(self):
        pass


@pytest.fixture
def raw_port(monkeypatch):
    """A RawPort (paced at `rate_mbps`) over a ScriptedSocket: make(rate_mbps, refuse)."""
    def make(rate_mbps=None, refuse=()):
        sock = ScriptedSocket(refuse)
        monkeypatch.setattr(sockets, "open_raw_sender", lambda *a, **k: sock)
        return ports.RawPort("10.0.0.1", "test port", rate_mbps), sock
    return make


class Stream:
    """A pacer sender: `count` packets of `size` bytes to `dst`, at `rate_mbps` (None: only
    the port paces it). Packets are numbered, so a resent one shows."""

    def __init__(self, name, size=986, count=1000, rate_mbps=None, dst="10.0.0.2"):
        self.name, self.size, self.left, self.dst = name, size, count, dst
        self.pace = Pace(rate_mbps) if rate_mbps else None
        self.held = None
        self.queued = False
        self.seq = 0
        self.sent_at = []
        self.refusals = []

    def has_packet(self):
        return self.left > 0

    def next_packet(self, now):
        self.seq += 1
        return f"{self.name}{self.seq:06d}".encode().ljust(self.size, b".")

    def sent(self, wire, now):
        self.left -= 1
        self.sent_at.append(now)
        if self.pace is not None:
            self.pace.charge(wire, now)

    def refused(self, refusal, now):
        self.refusals.append((refusal.kind, now))


def _run(pacer, until, start=0.0, step=None):
    """Drive `pacer` on a made-up clock: wake when it asks (or every `step`), until `until`."""
    now = start
    while now < until:
        wake = pacer.pump(now)
        if wake is None:
            return now
        now = now + step if step is not None else max(wake, now + 1e-6)
    return now


FRAME = 986 + roce.ETH_HEADER_LEN     # 1000 bytes on the wire: 1 ms at 8 Mbit/s

# -- Pace ------------------------------------------------------------------------------------------


def test_pace_advances_one_frame_time_per_packet():
    pace = Pace(8.0, due=1.0)
    pace.charge(1000, now=1.0)
    assert pace.due == pytest.approx(1.001)
    pace.charge(1000, now=1.0005)               # sent half a frame early: the schedule holds
    assert pace.due == pytest.approx(1.002) and pace.behind_s == 0


def test_pace_catches_up_at_most_max_burst_and_counts_the_rest():
    pace = Pace(8.0, due=1.0)
    pace.charge(1000, now=1.0 + MAX_BURST_S + 0.020)    # a 20 ms stall beyond the burst allowance
    assert pace.behind_s == pytest.approx(0.020)
    assert pace.due == pytest.approx(1.020 + 0.001)     # 5 ms of catch-up left


def test_out_of_turn_packets_take_their_time_without_catch_up_credit():
    pace = Pace(8.0, due=0.5)
    pace.charge_out_of_turn(1000, now=2.0)
    assert pace.due == pytest.approx(2.001) and pace.behind_s == 0


def test_hold_is_a_strict_not_before_and_drops_the_schedule_missed():
    pace = Pace(8.0, due=1.0)
    pace.hold(1.0005)
    assert pace.not_before == 1.0005 and pace.due == 1.0005
    unpaced = Pace()
    unpaced.charge(1000, now=3.0)
    assert unpaced.due <= 3.0                           # no rate: always due


# -- the pacer ---------------------------------------------------------------------------------------


def test_a_flow_is_sent_at_its_rate_never_more_than_send_ahead_early(raw_port):
    port, _sock = raw_port()
    pacer = Pacer(port)
    flow = Stream("a", rate_mbps=8.0, count=10_000)
    flow.pace.due = 1.0
    pacer.activate(flow, 0.0)
    _run(pacer, until=1.1, step=0.0001)
    assert len(flow.sent_at) == pytest.approx(100, abs=1)      # 1 ms a frame for 100 ms
    for i, at in enumerate(flow.sent_at):
        assert at >= 1.0 + i * 0.001 - SEND_AHEAD_S - 1e-9


def test_the_pacer_sleeps_until_the_next_packet_is_due_then_sends_a_batch(raw_port):
    port, _sock = raw_port()
    pacer = Pacer(port)
    flow = Stream("a", size=86, rate_mbps=8.0, count=10_000)   # 100-byte frames: 0.1 ms apart
    pacer.activate(flow, 0.0)
    wakes = 0
    now = 0.0
    while now < 0.1:
        wake = pacer.pump(now)
        wakes += 1
        now = max(wake, now + 1e-6)
    assert len(flow.sent_at) == pytest.approx(1000, abs=SEND_AHEAD_S / 0.0001 + 1)
    # one wake-up serves SEND_AHEAD_S of packets, not one packet each
    assert wakes <= 0.1 / SEND_AHEAD_S + 2


def test_senders_due_together_take_turns_under_the_port_rate(raw_port):
    port, sock = raw_port(rate_mbps=8.0)
    pacer = Pacer(port)
    streams = [Stream(name, count=5) for name in "abc"]
    for stream in streams:
        pacer.activate(stream, 0.0)
    _run(pacer, until=1.0)
    assert [data[:1].decode() for data, _ in sock.accepted] == list("abc" * 5)
    assert port.tx_packets == 15 and port.tx_bytes == 15 * FRAME
    gaps = [b - a for a, b in zip(streams[0].sent_at, streams[0].sent_at[1:])]
    assert all(gap == pytest.approx(0.003, abs=SEND_AHEAD_S) for gap in gaps)


def test_senders_of_different_rates_each_keep_their_own(raw_port):
    port, sock = raw_port()
    pacer = Pacer(port)
    fast, slow = Stream("f", rate_mbps=4.0, count=6), Stream("s", rate_mbps=2.0, count=3)
    for stream in (slow, fast):
        pacer.activate(stream, 0.0)
    _run(pacer, until=1.0, step=0.0001)
    assert len(sock.accepted) == 9
    for stream, gap in ((fast, 0.002), (slow, 0.004)):
        steps = [b - a for a, b in zip(stream.sent_at, stream.sent_at[1:])]
        assert steps == pytest.approx([gap] * len(steps), abs=SEND_AHEAD_S)


def test_a_full_queue_holds_the_whole_port_and_resends_the_same_packet_first(raw_port):
    port, sock = raw_port(refuse=[errno.ENOBUFS])
    pacer = Pacer(port)
    a, b = Stream("a", count=2), Stream("b", count=2)
    pacer.activate(a, 0.0)
    pacer.activate(b, 0.0)
    assert pacer.pump(1.0) == 1.0 + send_policy.BUSY_BACKOFF_S       # nothing else went
    assert a.refusals == [(send_policy.BUSY, 1.0)] and port.enobufs == 1 and not sock.accepted
    assert pacer.pump(1.0 + send_policy.BUSY_BACKOFF_S / 2) == 1.0 + send_policy.BUSY_BACKOFF_S
    pacer.pump(1.0 + send_policy.BUSY_BACKOFF_S)
    assert [data[:7] for data, _ in sock.accepted] == [b"a000001", b"b000001", b"a000002",
                                                       b"b000002"]


@pytest.mark.parametrize("code", sorted(send_policy.UNREACHABLE_ERRNOS))
def test_an_unreachable_destination_retries_later_while_the_others_go_on(raw_port, code):
    port, sock = raw_port(refuse=[code])
    pacer = Pacer(port)
    lost, other = Stream("x", count=1, dst="10.0.9.9"), Stream("o", count=3)
    pacer.activate(lost, 0.0)
    pacer.activate(other, 0.0)
    assert pacer.pump(0.0) == pytest.approx(send_policy.UNREACHABLE_BACKOFF_S)
    assert [data[:1] for data, _ in sock.accepted] == [b"o"] * 3
    assert lost.refusals == [(send_policy.UNREACHABLE, 0.0)] and port.send_errors == 1
    pacer.pump(send_policy.UNREACHABLE_BACKOFF_S)
    assert sock.accepted[-1] == (b"x000001".ljust(986, b"."), "10.0.9.9")     # the same packet
    assert pacer.pump(1.0) is None


def test_a_fatal_refusal_drops_that_sender_only(raw_port):
    port, sock = raw_port(refuse=[errno.EMSGSIZE])
    pacer = Pacer(port)
    bad, good = Stream("b", count=5), Stream("g", count=2)
    pacer.activate(bad, 0.0)
    pacer.activate(good, 0.0)
    assert pacer.pump(0.0) is None
    assert bad.refusals == [(send_policy.FATAL, 0.0)] and not bad.queued and bad.held
    assert len(sock.accepted) == 2 and port.enobufs == port.send_errors == 0


def test_a_sender_with_nothing_to_send_leaves_the_pacer(raw_port):
    port, _sock = raw_port()
    pacer = Pacer(port)
    idle = Stream("i", count=0)
    pacer.activate(idle, 0.0)
    pacer.activate(idle, 0.0)                      # queued once only
    assert len(pacer.heap) == 1
    assert pacer.pump(0.0) is None and not idle.queued and not pacer.heap


# -- the send policy and the port ---------------------------------------------------------------


@pytest.mark.parametrize("code, kind", [
    (errno.ENOBUFS, send_policy.BUSY), (errno.EAGAIN, send_policy.BUSY),
    (errno.ENETUNREACH, send_policy.UNREACHABLE), (errno.EHOSTUNREACH, send_policy.UNREACHABLE),
    (errno.ENETDOWN, send_policy.UNREACHABLE), (errno.EPERM, send_policy.UNREACHABLE),
    (errno.EMSGSIZE, send_policy.FATAL), (errno.EINVAL, send_policy.FATAL),
    (errno.EACCES, send_policy.FATAL)])
def test_every_errno_has_one_meaning(code, kind):
    assert send_policy.classify(_error(code)) == kind


def test_failure_detail_says_what_to_change():
    assert send_policy.failure_detail(_error(errno.EMSGSIZE), 9100, "10.0.0.2") == (
        "a 9100-byte packet exceeds the MTU towards 10.0.0.2; lower payload_bytes")
    assert send_policy.failure_detail(_error(errno.EINVAL), 100, "10.0.0.2") == (
        "send to 10.0.0.2 failed: Invalid argument")


def test_port_counts_what_went_and_each_refusal_by_kind(raw_port):
    port, _sock = raw_port(refuse=[errno.ENOBUFS, errno.EPERM, errno.ENETUNREACH,
                                   errno.EMSGSIZE, None])
    kinds = [port.transmit(b"x" * 86, "10.0.0.2") for _ in range(5)]
    assert [k.kind if k else None for k in kinds] == [send_policy.BUSY, send_policy.UNREACHABLE,
                                                       send_policy.UNREACHABLE, send_policy.FATAL,
                                                       None]
    assert port.report() == {"address": "10.0.0.1", "tx_packets": 1, "tx_bytes": 100,
                             "enobufs": 1, "send_errors": 2, "held_packets": 0}


def test_out_of_turn_packets_are_lost_when_refused_and_charged_when_sent(raw_port):
    port, sock = raw_port(rate_mbps=8.0, refuse=[errno.ENOBUFS, errno.EHOSTUNREACH,
                                                   errno.EMSGSIZE])
    assert port.transmit_out_of_turn(b"a" * 986, "10.0.0.2", now=1.0) is None     # lost
    assert port.transmit_out_of_turn(b"b" * 986, "10.0.0.2", now=1.0) is None     # lost
    assert port.transmit_out_of_turn(b"c" * 986, "10.0.0.2", now=1.0).kind == send_policy.FATAL
    assert port.pace.due == 0.0 and not sock.accepted
    assert port.transmit_out_of_turn(b"d" * 986, "10.0.0.2", now=1.0) is None
    assert port.pace.due == pytest.approx(1.001) and len(sock.accepted) == 1


def test_a_keyed_out_of_turn_packet_waits_out_a_full_queue_and_the_latest_of_a_key_stands(raw_port):
    # A PFC pause fills the port's queue: the ACKs of QPs 1 and 2 are held, not lost; QP 1's
    # newer ACK replaces its older one and goes behind QP 2's, in the order they were made.
    port, sock = raw_port(rate_mbps=8.0, refuse=[errno.ENOBUFS, errno.ENOBUFS, errno.ENOBUFS,
                                                   errno.ENOBUFS, None, None])
    assert port.transmit_out_of_turn(b"1" * 986, "10.0.0.2", now=1.0, hold_as=("ack", 1)) is None
    assert port.transmit_out_of_turn(b"2" * 986, "10.0.0.3", now=1.0, hold_as=("ack", 2)) is None
    assert port.transmit_out_of_turn(b"3" * 986, "10.0.0.2", now=1.0, hold_as=("ack", 1)) is None
    assert list(port.held) == [("ack", 2), ("ack", 1)] and port.held_packets == 3
    assert not sock.accepted and port.pace.due == 0.0
    assert port.send_held(now=1.5) is False and len(port.held) == 2       # still full
    assert port.send_held(now=2.0) is True and not port.held
    assert [packet[:1] for packet, _dst in sock.accepted] == [b"2", b"3"]
    assert port.pace.due == pytest.approx(2.002)                            # both charged
    assert port.report()["held_packets"] == 3


def test_ip_ids_wrap_and_skip_zero():
    ids = ports.IpIds(0xFFFE)
    assert [ids.take() for _ in range(4)] == [0xFFFE, 0xFFFF, 1, 2]


# -- the generator's flows on the pacer ------------------------------------------------------


def _streams(rates, **config):
    flows = [{"id": f"f{i}", "src": "10.0.0.1", "dst": "10.0.0.2", "src_qpn": 0x100 + i,
              "dst_qpn": 0x200 + i, "rate_mbps": rate} for i, rate in enumerate(rates)]
    parsed = generator.parse_config({"flows": flows, "duration_s": 1, "payload_bytes": 1024,
                                     "message_bytes": 4096, **config})
    rng = random.Random(7)
    return [generator.WriteStream(spec, parsed, rng) for spec in parsed.flows]


def test_flows_keep_their_rates_and_lose_no_psn_under_backpressure(raw_port):
    # The queue is full for 200 sends in a row (0.1 s of backoffs): every refused packet is
    # resent as it was, so the PSNs on the wire have no gap, and what the flows could not make
    # good afterwards is counted as schedule given up.
    refuse = [None] * 300 + [errno.ENOBUFS] * 200
    port, sock = raw_port(refuse=refuse)
    pacer = Pacer(port)
    streams = _streams([40.0, 20.0])
    for stream in streams:
        stream.start(0.0, 1.0)
        pacer.activate(stream, 0.0)
    _run(pacer, until=2.0, step=0.0002)
    for stream in streams:
        # 200 backoffs of 0.5 ms (0.6 ms on this clock's 0.2 ms steps), less the catch-up
        assert 0.1 - MAX_BURST_S <= stream.behind_s <= 0.12 - MAX_BURST_S + 0.001
        on_schedule = 1.0 - stream.behind_s
        assert stream.wire_bytes * 8 / on_schedule / 1e6 == pytest.approx(stream.spec.rate_mbps,
                                                                          rel=0.02)
    # the packet at the head of the line is the one refused, again and again
    assert sum(s.enobufs for s in streams) == port.enobufs == 200
    by_qp = {}
    for data, _dst in sock.accepted:
        bth = roce.parse_bth(data[roce.IPV4_HEADER_LEN + roce.UDP_HEADER_LEN:])
        by_qp.setdefault(bth.dest_qp, []).append(bth.psn)
    for psns in by_qp.values():
        assert all(roce.psn_add(a) == b for a, b in zip(psns, psns[1:]))


def test_a_stalled_flow_gives_up_schedule_and_says_so(raw_port):
    port, _sock = raw_port()
    pacer = Pacer(port)
    (stream,) = _streams([20.0])
    stream.start(0.0, 1.0)
    pacer.activate(stream, 0.0)
    _run(pacer, until=0.1, step=0.0002)
    _run(pacer, start=0.4, until=1.1, step=0.0002)            # the agent got no CPU for 0.3 s
    assert stream.behind_s == pytest.approx(0.3 - MAX_BURST_S, abs=0.002)


def _host_sender(raw_port, refuse, rates=(20.0, 20.0)):
    flows = [{"id": f"f{i}", "src": "10.0.0.1", "dst": "10.0.0.2", "src_qpn": 0x100 + i,
              "dst_qpn": 0x200 + i, "rate_mbps": rate} for i, rate in enumerate(rates)]
    config = generator.parse_config({"flows": flows, "duration_s": 0.05, "payload_bytes": 1024})
    sender = generator.HostSender(config, threading.Event(), seed=3)
    port, sock = raw_port(refuse=refuse)
    sender.ports = {"10.0.0.1": port}
    sender.pacers = {"10.0.0.1": Pacer(port)}
    return sender, sock


def test_the_generator_reports_a_fatal_send_per_flow_and_runs_the_others(raw_port):
    sender, sock = _host_sender(raw_port, refuse=[errno.EMSGSIZE])
    start = time.monotonic()
    sender.run(start, start + 0.05)
    failed = [flow for flow in sender.flows if flow.failed]
    assert len(failed) == 1 and failed[0].packets == 0
    assert sender.errors == [f"flow {failed[0].spec.id!r}: a {len(failed[0].held)}-byte packet "
                             f"exceeds the MTU towards 10.0.0.2; lower payload_bytes"]
    assert sum(flow.packets for flow in sender.flows) == len(sock.accepted) > 0


def test_the_generator_warns_once_per_flow_about_routing_errors(raw_port):
    sender, _sock = _host_sender(raw_port, refuse=[errno.EHOSTUNREACH] * 3, rates=(20.0,))
    start = time.monotonic()
    sender.run(start, start + 0.05)
    (flow,) = sender.flows
    assert flow.send_errors == 3 and flow.packets > 0 and sender.errors == []
    assert sender.warnings == ["flow 'f0': No route to host sending to 10.0.0.2 from 10.0.0.1; "
                               "retried (3 refusals)"]
