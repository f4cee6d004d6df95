"""The lab's RNIC as one RC QP driven by commands (traffic/rc_endpoint.py): two endpoints on a
wire made of lists, so every packet is the bytes the lab would send, ICRC and all (no network).
The lab test in tests/lab/test_kernel_fabric.py puts the kernel's soft-RoCE on the other end."""

import io
import json

import pytest

from fabriclab.errors import LabError
from fabriclab.traffic import roce
from fabriclab.traffic.rc_endpoint import VADDR_BASE, EndpointError, RcEndpoint, handle, serve


class Wire:
    """Two ends: what one transmits the other receives, unless `drop` says otherwise."""

    def __init__(self):
        self.inbox = {}
        self.sent = []

    def end(self, address):
        wire = self
        self.inbox[address] = []

        class End:
            def transmit(self, packet, dst):
                wire.sent.append(packet)
                wire.inbox[dst].append(packet)
                return None

            def receive(self, _wait):
                queued, wire.inbox[address] = wire.inbox[address], []
                yield from queued
        return End()


def pair(**options):
    wire = Wire()
    a = RcEndpoint("10.1.0.1", wire.end("10.1.0.1"), qpn=0x11, psn=100, rkey=0xA, **options)
    b = RcEndpoint("10.1.0.2", wire.end("10.1.0.2"), qpn=0x22, psn=7000, rkey=0xB, **options)
    a.connect("10.1.0.2", 0x22, 7000)
    b.connect("10.1.0.1", 0x11, 100)
    return wire, a, b


def exchange(wire, a, b, now=0.0, rounds=50):
    """Pump and deliver at time `now` until nothing moves (the transports may still wait)."""
    for _ in range(rounds):
        for end in (a, b):
            end.timers(now)
            end.pump(now)
        moved = False
        for end in (a, b):
            for datagram in list(end.io.receive(0)):
                end.on_datagram(datagram, now)
                moved = True
        if not moved:
            return
    raise AssertionError("the two endpoints did not settle")


def test_writes_and_sends_land_byte_for_byte_and_are_acknowledged():
    wire, a, b = pair()
    data = bytes(range(256)) * 11 + b"xyz"                  # 2819 bytes: 3 packets, 1 pad byte
    a.post(data, send=False, vaddr=VADDR_BASE + 64, rkey=0xB)
    a.post(data[:100], send=False, vaddr=VADDR_BASE + 8192, rkey=0xB, immediate=0x1234)
    b.post_receive(16384, 4096)
    a.post(data, send=True, immediate=0xBEEF)
    a.post(b"ping", send=True)                              # no receive posted yet: RNR NAK
    exchange(wire, a, b)
    assert b.responder.counters.rnr_naks_sent == 1 and a.requester.counters.rnr_naks == 1
    b.post_receive(32768, 64)
    exchange(wire, a, b, now=1.0)                           # after the RNR timer
    assert bytes(b.memory[64:64 + len(data)]) == data
    assert bytes(b.memory[8192:8292]) == data[:100]
    assert bytes(b.memory[16384:16384 + len(data)]) == data
    assert bytes(b.memory[32768:32772]) == b"ping"
    assert a.completed == [1, 2, 3, 4]
    assert [(m["kind"], m["immediate"], m["length"]) for m in b.received] == [
        ("write", None, None), ("write_with_immediate", 0x1234, 100), ("send", 0xBEEF, len(data)),
        ("send", None, 4)]
    assert a.opcodes_out["RC_SEND_LAST_WITH_IMMEDIATE"] == 1 and b.opcodes_in["RC_RDMA_WRITE_MIDDLE"] == 1
    assert b.counters["icrc_errors"] == 0 and b.counters["icrc_ok"] == b.counters["rx_datagrams"] > 0
    # every packet on the wire is a RoCEv2 datagram with a correct ICRC
    assert all(roce.icrc_ok(packet) for packet in wire.sent)


def test_a_corrupted_icrc_is_dropped_and_the_ack_timer_sends_it_again():
    wire, a, b = pair(ack_timeout_s=0.5)
    a.post(b"\x5a" * 40, send=False, vaddr=VADDR_BASE, rkey=0xB)
    shown = a.inject_corrupt(0.0)
    assert shown["opcode"] == "RC_RDMA_WRITE_ONLY" and shown["icrc_ok"] is False
    assert shown["icrc_sent"] != shown["icrc_correct"]
    for datagram in list(b.io.receive(0)):
        b.on_datagram(datagram, 0.1)
    assert b.counters["icrc_errors"] == 1 and b.responder.counters.packets == 0
    assert bytes(b.memory[:40]) == bytes(40) and not wire.inbox["10.1.0.1"]      # no ACK
    exchange(wire, a, b, now=0.2)                           # before the timeout: nothing moves
    assert a.completed == []
    exchange(wire, a, b, now=0.6)
    assert a.completed == [1] and bytes(b.memory[:40]) == b"\x5a" * 40
    assert a.requester.counters.local_ack_timeout_err == 1
    assert a.requester.counters.retransmitted_packets == 1


def test_a_write_outside_the_memory_or_with_another_key_is_refused():
    for vaddr, rkey in ((VADDR_BASE, 0xC), (VADDR_BASE + (1 << 20) - 4, 0xB)):
        wire, a, b = pair()
        a.post(b"12345678", send=False, vaddr=vaddr, rkey=rkey)
        with pytest.raises(LabError, match="remote NAK with syndrome 0x62"):
            exchange(wire, a, b)
        assert b.counters["remote_access_errors"] == 1 and not any(b.memory)


def test_commands_are_checked_and_answered_one_line_each():
    wire = Wire()
    end = RcEndpoint("10.1.0.1", wire.end("10.1.0.1"), qpn=0x11, psn=5, rkey=1)
    with pytest.raises(EndpointError, match="not connected"):
        handle(end, {"op": "send", "data": "00", "immediate": None})
    for bad, message in (({"op": "launch"}, "op must be one of"),
                         ({"op": "connect", "peer_address": "10.1.0.2", "peer_qpn": 3, "peer_psn": 0,
                           "mtu": 1}, "unknown key mtu"),
                         ({"op": "connect", "peer_address": "nowhere", "peer_qpn": 3, "peer_psn": 0},
                          "IPv4 address"),
                         ({"op": "connect", "peer_address": "10.1.0.2", "peer_qpn": 1 << 24,
                           "peer_psn": 0}, "peer_qpn must be")):
        with pytest.raises(EndpointError, match=message):
            handle(end, bad)
    assert handle(end, {"op": "connect", "peer_address": "10.1.0.2", "peer_qpn": 3, "peer_psn": 0})
    for bad, message in (({"op": "send", "data": "zz"}, "hex"),
                         ({"op": "send", "data": ""}, "1..1048576 bytes"),
                         ({"op": "write", "data": "00", "vaddr": 0, "rkey": -1}, "rkey must be"),
                         ({"op": "post_recv", "offset": 1 << 20, "length": 1}, "outside"),
                         ({"op": "inject", "corrupt_icrc": True}, "nothing posted"),
                         ({"op": "run", "timeout_s": float("nan")}, "timeout_s must be")):
        with pytest.raises(EndpointError, match=message):
            handle(end, bad)
    with pytest.raises(EndpointError, match="qpn must be"):
        RcEndpoint("10.1.0.1", None, qpn=1)
    with pytest.raises(EndpointError, match="path MTU"):
        RcEndpoint("10.1.0.1", None, payload_bytes=1000)
    out = io.StringIO()
    serve(end, ['{"op": "read", "offset": 0, "length": 2}\n', "not json\n", '{"op": "quit"}\n',
                '{"op": "counters"}\n'], out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["ready"]["qpn"] == 0x11 and lines[0]["ready"]["vaddr"] == VADDR_BASE
    assert lines[1] == {"ok": {"data": "0000"}} and "not a JSON command" in lines[2]["error"]
    assert "ok" in lines[3] and len(lines) == 4                 # nothing after quit
