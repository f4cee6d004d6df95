"""One RC queue pair of the lab's raw-socket RNIC, driven by commands: the lab's RNIC facing
another RDMA stack (in the full-kernel tier, the kernel's soft-RoCE).

    python -m fabriclab.traffic.rc_endpoint --address 10.1.2.1 [--qpn N] [--psn P]

It runs inside a lab host's network namespace, as a collective's agent does, and moves packets
with the agent's own parts: `roce` builds and parses every packet, `transport.Requester` and
`transport.Responder` run the RC transport (PSNs, ACKs, NAKs, go-back-N, the ACK timer, RNR
waits), `ports.RawPort` sends through a raw socket bound to the port's address. The other side
of the connection is told the endpoint's QPN, PSN, memory address and R_Key out of band (its
first output line), and tells it its own (`connect`).

The one difference from the agent is on purpose: the endpoint reads whole IPv4 datagrams from a
packet socket on the port, so it checks every ICRC as an RNIC does and drops a bad one (the
agent's UDP socket sees no IP header to check it against). Its UDP 4791 socket is bound only so
that the kernel answers nothing with ICMP.

Protocol: one JSON object per line on stdin, one JSON answer per line on stdout, in order. The
first line out is {"ready": {...}}; every answer is {"ok": {...}} or {"error": "one line"}.

    {"op": "connect", "peer_address": A, "peer_qpn": N, "peer_psn": P}
    {"op": "post_recv", "offset": O, "length": L}        a receive buffer in the memory
    {"op": "write", "vaddr": V, "rkey": K, "data": HEX, "immediate": I or null}
    {"op": "send", "data": HEX, "immediate": I or null}
    {"op": "inject", "corrupt_icrc": true}   transmit the next packet now, its ICRC flipped
    {"op": "run", "timeout_s": T, "received": N}   until every posted message is acknowledged
                                              and N messages have arrived in all (or T passed)
    {"op": "read", "offset": O, "length": L}            memory bytes, hex
    {"op": "counters"}
    {"op": "quit"}
"""

from __future__ import annotations

import argparse
import json
import secrets
import select
import socket
import struct
import sys
import time
from collections import Counter

from fabriclab.errors import LabError
from fabriclab.traffic import roce, send_policy, sockets
from fabriclab.traffic.transport import (ReceiveRequest, Requester, Responder, TransportError,
                                         WriteRequest)

VADDR_BASE = 0x7F0000000000
"""Where the endpoint's memory starts in the address space its RETHs and receive requests use."""
MEMORY_BYTES = 1 << 20
MAX_DATA_BYTES = 1 << 20
ACK_TIMEOUT_S = 1.0
RETRY_LIMIT = 7
ETH_P_IP = 0x0800
PACKET_HOST = 0
"""A packet socket's pkttype for a frame addressed to this host (not one it sends)."""
IDLE_WAIT_S = 0.05


class EndpointError(Exception):
    """A command the endpoint refuses: its answer is {"error": message}."""


class RcEndpoint:
    """The QP's state and its packets; `io` moves them (`transmit(packet, dst)` returns None or
    a ports.Refusal, `receive()` yields whole IPv4 datagrams addressed to `address`)."""

    def __init__(self, address, io, *, qpn=None, psn=None, memory_bytes=MEMORY_BYTES,
                 payload_bytes=1024, ack_timeout_s=ACK_TIMEOUT_S, rkey=None):
        if payload_bytes not in roce.ROCE_PATH_MTUS:
            raise EndpointError(f"payload bytes must be a RoCE path MTU "
                                f"({', '.join(map(str, roce.ROCE_PATH_MTUS))}), got {payload_bytes}")
        if qpn is not None and not 2 <= qpn <= roce.QPN_MASK:
            raise EndpointError(f"qpn must be in 2..{roce.QPN_MASK} (0 and 1 are special QPs), got {qpn}")
        if psn is not None and not 0 <= psn <= roce.PSN_MASK:
            raise EndpointError(f"psn must be in 0..{roce.PSN_MASK}, got {psn}")
        self.address = address
        self.io = io
        self.qpn = qpn if qpn is not None else 0x100 + secrets.randbelow(0xFFFE00)
        self.psn = psn if psn is not None else secrets.randbelow(roce.PSN_MODULUS)
        self.rkey = rkey if rkey is not None else secrets.randbits(32)
        self.payload_bytes = payload_bytes
        self.ack_timeout_s = ack_timeout_s
        self.memory = bytearray(memory_bytes)
        self.ip_id = 1
        self.peer = None                     # (address, qpn)
        self.requester = self.responder = None
        self.sport = roce.ROCE_UDP_SPORT_MIN
        self.held = None                     # a packet the port refused as busy: it goes first
        self.posted = 0                      # messages posted
        self.completed = []                  # posted messages acknowledged, by context
        self.received = []                   # messages arrived: {"kind", "immediate", ...}
        self.counters = Counter()
        self.opcodes_in = Counter()
        self.opcodes_out = Counter()

    # -- set-up ------------------------------------------------------------------------------------

    def describe(self):
        return {"address": self.address, "qpn": self.qpn, "psn": self.psn, "rkey": self.rkey,
                "vaddr": VADDR_BASE, "memory_bytes": len(self.memory),
                "payload_bytes": self.payload_bytes}

    def connect(self, peer_address, peer_qpn, peer_psn):
        self.peer = (peer_address, peer_qpn)
        self.requester = Requester(self.psn, self.payload_bytes, timeout_s=self.ack_timeout_s,
                                   retry_limit=RETRY_LIMIT)
        self.responder = Responder(peer_psn)
        self.sport = roce.udp_source_port(self.qpn, peer_qpn)

    def _connected(self):
        if self.requester is None:
            raise EndpointError("not connected: send connect first")

    def _span(self, offset, length):
        if not (0 <= offset and 0 <= length and offset + length <= len(self.memory)):
            raise EndpointError(f"{length} bytes at offset {offset} are outside the "
                                f"{len(self.memory)}-byte memory")

    def post_receive(self, offset, length):
        self._connected()
        self._span(offset, length)
        self.responder.post_receive(ReceiveRequest(VADDR_BASE + offset, length,
                                                   context=len(self.responder.receives)))

    def post(self, data, *, send, vaddr=0, rkey=0, immediate=None):
        self._connected()
        if not 1 <= len(data) <= MAX_DATA_BYTES:
            raise EndpointError(f"a message carries 1..{MAX_DATA_BYTES} bytes, got {len(data)}")
        if immediate is not None and not 0 <= immediate < 1 << 32:
            raise EndpointError(f"immediate data is 32 bits, got {immediate}")
        self.posted += 1
        self.requester.post(WriteRequest(len(data), vaddr, rkey, immediate, bytes(data),
                                         context=self.posted, send=send))

    # -- sending -----------------------------------------------------------------------------------

    def build_next(self, now):
        """The requester's next packet, built as the agent builds it (the immediate data first,
        after the RETH if there is one)."""
        opcode, psn, ack_req, reth, immediate, request, offset, length = \
            self.requester.next_packet(now)
        payload = request.data[offset:offset + length]
        if immediate is not None:
            payload = immediate.to_bytes(4, "big") + payload
        self.opcodes_out[roce.OPCODE_NAMES.get(opcode, hex(opcode))] += 1
        return psn, opcode, self._datagram(opcode, psn, payload, reth=reth, ack_req=ack_req)

    def _datagram(self, opcode, psn, payload, **fields):
        ip_id = self.ip_id
        self.ip_id = ip_id % 0xFFFF + 1           # never 0: Linux would rewrite it (ports.IpIds)
        return roce.build_ipv4_udp_roce_packet(self.address, self.peer[0], self.sport, opcode,
                                               self.peer[1], psn, payload, ip_id=ip_id, **fields)

    def _transmit(self, packet):
        refusal = self.io.transmit(packet, self.peer[0])
        if refusal is None:
            self.counters["tx_packets"] += 1
            return True
        if refusal.kind is send_policy.FATAL:
            raise LabError(send_policy.failure_detail(refusal.error, len(packet), self.peer[0]))
        self.counters["tx_refused"] += 1
        return False

    def pump(self, now):
        """Send what the requester has (a refused packet first). Returns when to call again
        (None: when something arrives)."""
        if self.held is not None:
            if not self._transmit(self.held):
                return now + send_policy.BUSY_BACKOFF_S
            self.held = None
        requester = self.requester
        if requester is None:
            return None
        while requester.has_packet():
            if not requester.ready(now):
                return requester.rnr_until
            _psn, _opcode, packet = self.build_next(now)
            if not self._transmit(packet):
                self.held = packet
                return now + send_policy.BUSY_BACKOFF_S
        return requester.deadline()

    def inject_corrupt(self, now):
        """Transmit the requester's next packet with its ICRC's last byte flipped (the packet
        counts as sent: the transport's ACK timer sends it again, correct). Returns what went."""
        self._connected()
        if not self.requester.has_packet():
            raise EndpointError("nothing posted to corrupt: post a write or send first")
        psn, opcode, packet = self.build_next(now)
        bad = packet[:-1] + bytes([packet[-1] ^ 0xFF])
        if not self._transmit(bad):
            raise EndpointError("the port refused the corrupted packet")
        self.counters["icrc_corrupted_sent"] += 1
        return {"psn": psn, "opcode": roce.OPCODE_NAMES.get(opcode, hex(opcode)),
                "bytes": len(bad), "icrc_sent": bad[-4:].hex(),
                "icrc_correct": packet[-4:].hex(), "icrc_ok": roce.icrc_ok(bad)}

    def timers(self, now):
        """The ACK timer: a timeout rewinds to the oldest unacknowledged packet."""
        if self.requester is not None:
            try:
                self.requester.check_timeout(now)
            except TransportError as exc:
                raise LabError(f"QP {self.qpn:#x}: {exc}") from None

    # -- receiving ---------------------------------------------------------------------------------

    def on_datagram(self, datagram, now):
        """One IPv4 datagram addressed to the port: checked, parsed and handled."""
        header = _udp_payload(datagram)
        if header is None:
            return
        src, payload = header
        self.counters["rx_datagrams"] += 1
        if not roce.icrc_ok(datagram):
            self.counters["icrc_errors"] += 1        # dropped, as an RNIC drops it
            return
        self.counters["icrc_ok"] += 1
        try:
            parsed = roce.parse_roce(payload)
        except ValueError:
            self.counters["malformed"] += 1
            return
        bth = parsed.bth
        if self.peer is None or bth.dest_qp != self.qpn or src != self.peer[0]:
            self.counters["not_for_this_qp"] += 1
            return
        self.opcodes_in[roce.OPCODE_NAMES.get(bth.opcode, hex(bth.opcode))] += 1
        if bth.opcode == roce.OP_RC_ACKNOWLEDGE:
            try:
                done = self.requester.on_ack(bth.psn, parsed.aeth, now)
            except TransportError as exc:
                raise LabError(f"QP {self.qpn:#x}: {exc}") from None
            self.completed += [request.context for request in done]
            return
        if bth.opcode not in roce.SEND_OPCODES and bth.opcode not in roce.RETH_OPCODES \
                and bth.opcode not in (roce.OP_RC_RDMA_WRITE_MIDDLE, roce.OP_RC_RDMA_WRITE_LAST,
                                       roce.OP_RC_RDMA_WRITE_LAST_WITH_IMMEDIATE):
            self.counters["unsupported_opcode"] += 1
            return
        if parsed.reth is not None and bth.psn == self.responder.expected \
                and not self._may_write(parsed.reth):
            # A WRITE outside the memory or with another key: a remote access error NAK, and
            # nothing written (a MIDDLE or LAST stays inside its FIRST's checked RETH).
            self.counters["remote_access_errors"] += 1
            self._reply(bth.psn, roce.AETH_NAK_REMOTE_ACCESS_ERROR)
            return
        action = self.responder.on_packet(parsed, now)
        if action.placement is not None:
            place = action.placement
            start = place.vaddr - VADDR_BASE
            self.memory[start:start + place.length] = \
                payload[place.offset_in_payload:place.offset_in_payload + place.length]
        if action.reply is not None:
            self._reply(*action.reply)
        if action.completion is not None:
            done = action.completion
            self.received.append({"kind": "send" if done.send else "write_with_immediate",
                                  "immediate": done.immediate, "offset": done.vaddr - VADDR_BASE,
                                  "length": done.length})
        elif action.placement is not None and bth.opcode in roce.LAST_OPCODES:
            self.received.append({"kind": "write", "immediate": None, "offset": None,
                                  "length": None})

    def _may_write(self, reth):
        start = reth.vaddr - VADDR_BASE
        return reth.rkey == self.rkey and 0 <= start and start + reth.dma_len <= len(self.memory)

    def _reply(self, psn, syndrome):
        packet = self._datagram(roce.OP_RC_ACKNOWLEDGE, psn,
                                roce.build_aeth(syndrome, self.responder.msn))
        self.opcodes_out["RC_ACKNOWLEDGE"] += 1
        self._transmit(packet)

    # -- the loop ----------------------------------------------------------------------------------

    def idle(self):
        return self.requester is None or (self.requester.idle and self.held is None)

    def run(self, timeout_s, received=0):
        """Move packets until every posted message is acknowledged and `received` messages have
        arrived, or `timeout_s` passed. Returns whether it got there."""
        self._connected()
        start = time.monotonic()
        end = start + timeout_s
        while True:
            now = time.monotonic()
            self.timers(now)
            wake = self.pump(now)
            if self.idle() and len(self.received) >= received:
                return True
            if now >= end:
                return False
            wait = end - now if wake is None else min(max(wake - now, 0.0), end - now)
            for datagram in self.io.receive(min(wait, IDLE_WAIT_S)):
                self.on_datagram(datagram, time.monotonic())

    def report(self):
        r = self.requester.counters if self.requester else None
        s = self.responder.counters if self.responder else None
        return {"counters": dict(self.counters), "opcodes_in": dict(self.opcodes_in),
                "opcodes_out": dict(self.opcodes_out),
                "requester": vars(r) if r else None, "responder": vars(s) if s else None,
                "completed": list(self.completed), "received": list(self.received),
                "posted": self.posted}


def _udp_payload(datagram):
    """(source address, UDP payload) of an IPv4 UDP datagram to port 4791, else None."""
    if len(datagram) < roce.IPV4_HEADER_LEN or datagram[0] >> 4 != 4:
        return None
    ihl = (datagram[0] & 0x0F) * 4
    if datagram[9] != roce.IPPROTO_UDP or len(datagram) < ihl + roce.UDP_HEADER_LEN:
        return None
    if struct.unpack_from("!H", datagram, ihl + 2)[0] != roce.ROCEV2_UDP_PORT:
        return None
    return socket.inet_ntoa(datagram[12:16]), datagram[ihl + roce.UDP_HEADER_LEN:]


# -- the host's sockets ------------------------------------------------------------------------------


class RawIo:
    """The port's raw sender (ports.RawPort), a packet socket reading every IPv4 datagram to the
    address, and the UDP 4791 socket that keeps ICMP quiet (read and discarded)."""

    def __init__(self, address):
        from fabriclab.traffic.ports import RawPort

        self.address = address
        self.port = RawPort(address, f"endpoint {address}")
        self.quiet = self.port.listen()
        self.tap = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_IP))
        self.tap.setblocking(False)
        self.wanted = socket.inet_aton(address)

    def transmit(self, packet, dst):
        return self.port.transmit(packet, dst)

    def receive(self, wait_s):
        ready, _, _ = select.select([self.tap, self.quiet], [], [], max(wait_s, 0.0))
        if self.quiet in ready:
            for _ in self.port.receive():
                pass
        if self.tap not in ready:
            return
        while True:
            try:
                data, address = self.tap.recvfrom(65536)
            except (BlockingIOError, InterruptedError):
                return
            if address[2] != PACKET_HOST or len(data) < roce.IPV4_HEADER_LEN or data[16:20] != self.wanted:
                continue
            total = struct.unpack_from("!H", data, 2)[0]
            yield data[:total]                     # without any Ethernet padding

    def close(self):
        self.port.close()
        self.tap.close()


# -- commands ----------------------------------------------------------------------------------------

def _int(command, key, low=0, high=(1 << 64) - 1, default=None):
    value = command.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise EndpointError(f"{key} must be an integer in {low}..{high}, got {value!r}")
    return value


def _data(command):
    text = command.get("data")
    try:
        return bytes.fromhex(text)
    except (TypeError, ValueError):
        raise EndpointError("data must be a hex string") from None


COMMAND_KEYS = {
    "connect": {"peer_address", "peer_qpn", "peer_psn"},
    "post_recv": {"offset", "length"},
    "write": {"vaddr", "rkey", "data", "immediate"},
    "send": {"data", "immediate"},
    "inject": {"corrupt_icrc"},
    "run": {"timeout_s", "received"},
    "read": {"offset", "length"},
    "counters": set(),
    "quit": set(),
}


def handle(endpoint, command):
    """Carry out one command; returns its answer's body. Raises EndpointError for a bad one."""
    if not isinstance(command, dict) or command.get("op") not in COMMAND_KEYS:
        raise EndpointError(f"op must be one of {', '.join(COMMAND_KEYS)}")
    op = command["op"]
    unknown = set(command) - COMMAND_KEYS[op] - {"op"}
    if unknown:
        raise EndpointError(f"{op}: unknown key {sorted(unknown)[0]}")
    if op == "connect":
        try:
            peer = socket.inet_ntoa(socket.inet_aton(command.get("peer_address", "")))
        except (OSError, TypeError):
            raise EndpointError("peer_address must be an IPv4 address") from None
        endpoint.connect(peer, _int(command, "peer_qpn", 1, roce.QPN_MASK),
                         _int(command, "peer_psn", 0, roce.PSN_MASK))
        return {"sport": endpoint.sport}
    if op == "post_recv":
        endpoint.post_receive(_int(command, "offset"), _int(command, "length"))
        return {}
    if op in ("write", "send"):
        immediate = command.get("immediate")
        if immediate is not None:
            immediate = _int(command, "immediate", 0, 0xFFFFFFFF)
        if op == "write":
            endpoint.post(_data(command), send=False, vaddr=_int(command, "vaddr"),
                          rkey=_int(command, "rkey", 0, 0xFFFFFFFF), immediate=immediate)
        else:
            endpoint.post(_data(command), send=True, immediate=immediate)
        return {"posted": endpoint.posted}
    if op == "inject":
        if command.get("corrupt_icrc") is not True:
            raise EndpointError("inject: corrupt_icrc must be true (the only injection)")
        return endpoint.inject_corrupt(time.monotonic())
    if op == "run":
        timeout = command.get("timeout_s")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 600:
            raise EndpointError(f"timeout_s must be in (0, 600], got {timeout!r}")
        start = time.monotonic()
        done = endpoint.run(float(timeout), _int(command, "received", default=0))
        return {"done": done, "elapsed_s": round(time.monotonic() - start, 4), **endpoint.report()}
    if op == "read":
        offset, length = _int(command, "offset"), _int(command, "length")
        endpoint._span(offset, length)
        return {"data": endpoint.memory[offset:offset + length].hex()}
    return endpoint.report()


def serve(endpoint, lines, out):
    """Answer each command line of `lines` on `out` until quit or end of input."""
    print(json.dumps({"ready": endpoint.describe()}), file=out, flush=True)
    for line in lines:
        if not line.strip():
            continue
        command = None
        try:
            command = json.loads(line)
            body = handle(endpoint, command)
            answer = {"ok": body}
        except ValueError as exc:
            answer = {"error": f"not a JSON command: {exc}"} if isinstance(exc, json.JSONDecodeError) \
                else {"error": str(exc)}
        except EndpointError as exc:
            answer = {"error": str(exc)}
        print(json.dumps(answer), file=out, flush=True)
        if isinstance(command, dict) and command.get("op") == "quit":
            return


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fabriclab.traffic.rc_endpoint",
                                     description="one RC QP of the lab's raw-socket RNIC")
    parser.add_argument("--address", required=True, help="the port's IPv4 address")
    parser.add_argument("--qpn", type=int, help="the QP number (default: random)")
    parser.add_argument("--psn", type=int, help="the first PSN it sends (default: random)")
    parser.add_argument("--payload-bytes", type=int, default=1024, help="the path MTU's payload")
    parser.add_argument("--ack-timeout", type=float, default=ACK_TIMEOUT_S,
                        help="the local ACK timeout, seconds")
    args = parser.parse_args(argv)
    sockets.die_with_parent()
    io = None
    try:
        io = RawIo(args.address)
        endpoint = RcEndpoint(args.address, io, qpn=args.qpn, psn=args.psn,
                              payload_bytes=args.payload_bytes, ack_timeout_s=args.ack_timeout)
        serve(endpoint, sys.stdin, sys.stdout)
    except (LabError, EndpointError) as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        print(f"rc_endpoint: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if io is not None:
            io.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
