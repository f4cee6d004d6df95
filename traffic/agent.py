"""The collective agent: one per rank (a host NIC), an RDMA NIC and a collective library in one.

Runs inside a Mininet host's network namespace::

    python -m fabriclab.traffic.agent --config RANK.json

It connects to the launcher's control socket (a Unix socket in the run folder: reachable from
every namespace, since they share the file system), then serves commands until told to stop:

    {"prepare": i}            build the schedule and memory for the i-th message size -> "ready"
    {"run": k, "start_at": t} run iteration k, starting at unix time t -> "done" with timings,
                              counters and (verify mode) the check against numpy
    {"status": true}          what this rank is still waiting for -> "status"
    {"stop": true}            send the final counters -> "final", then exit

Data path: per QP a `transport.Requester` and `transport.Responder`, packets built by `roce`
and sent through a raw socket per port (one port per plane), paced at the port's line rate, QPs
served round-robin as an RNIC's scheduler does, each QP optionally limited by DCQCN. A transfer
of the schedule is cut into NIC messages of `chunk_bytes` (RDMA WRITE with immediate = the
transfer's tag); QP scaling spreads them over the connection's QPs, either splitting each
message ("split") or posting whole messages in turn ("round-robin"), seed 000 section 4.2.4.
With CTS admission a sender may write a message only within the bytes its receiver granted
(seed 000 section 5.2.2).

Errors: a bad config or host exits 2 with one line on stderr; a failed QP (the retry counter ran
out: the peer is dead or unreachable) is reported to the launcher with the peer's rank, then the
agent exits 1. The agent exits when the launcher goes away.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import selectors
import signal
import socket
import sys
import time
from collections import deque

from fabriclab.errors import LabError
from fabriclab.traffic import dcqcn, roce, schedules, sockets
from fabriclab.traffic.engine import (REGION_IDS, Memory, RankEngine, remote_address,
                                       split_address)
from fabriclab.traffic.transport import Requester, Responder, TransportError, WriteRequest

MAX_BURST_S = 0.005          # a port that fell behind its pace catches up by at most this much
SEND_AHEAD_S = 0.0003        # a packet due this soon is sent now (one wake-up serves several)
BACKOFF_S = 0.0005           # after the local qdisc refused a packet
UNREACHABLE_BACKOFF_S = 0.01  # after a routing error (link down, route being replaced)
RECEIVE_BATCH = 64
TIMER_PERIOD_S = 0.02
"""How often ACK timeouts and DCQCN timers are checked: well inside the shortest sensible ACK
timeout, and rare enough that an idle agent costs little CPU (it wakes for packets anyway)."""
MAX_IDLE_WAIT_S = 0.05
QP_METHODS = ("round-robin", "split")
_BUSY = frozenset({errno.ENOBUFS, errno.EAGAIN})
_UNREACHABLE = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.EHOSTDOWN,
                          errno.ENXIO, errno.EPERM})


class Port:
    """One NIC port (a plane): its sockets, its pacer and its QP round-robin."""

    def __init__(self, index, address, rate_mbps, send_buffer=None):
        self.index = index
        self.address = address
        self.seconds_per_byte = 8 / (rate_mbps * 1e6)
        self.rate_mbps = rate_mbps
        self.sender = sockets.open_raw_sender(address, f"port {address}", send_buffer)
        self.listener = sockets.open_roce_listener(address)
        self.listener.setblocking(False)
        self.next_free = 0.0
        self.active = deque()          # QPs with something to send
        self.held = None               # (packet, qp) the qdisc refused, sent first next time
        self.ip_id = 1
        self.enobufs = 0
        self.send_errors = 0
        self.tx_packets = 0
        self.tx_bytes = 0

    def next_ip_id(self):
        # Linux fills in an IP ID of 0 on raw sockets, which would change bytes the ICRC covers.
        ip_id = self.ip_id
        self.ip_id = self.ip_id % 0xFFFF + 1
        return ip_id

    def close(self):
        self.sender.close()
        self.listener.close()


class QueuePair:
    """A local QP connected to a peer's QP: both RC halves, DCQCN state, counters."""

    def __init__(self, spec, port, transport, rp_params):
        self.qpn = spec["qpn"]
        self.peer = spec["peer"]
        self.peer_qpn = spec["peer_qpn"]
        self.peer_address = spec["peer_address"]
        self.channel = spec["channel"]
        self.sport = spec["sport"]
        # Packet spraying: a multipath NIC varies the source port per packet so ECMP spreads one
        # QP over paths; the RC transport here does not tolerate the reordering that follows.
        spray = transport.get("spray", 1)
        self.sports = [roce.ROCE_UDP_SPORT_MIN | ((self.sport + i * 0x1111) & 0x3FFF)
                       for i in range(spray)]
        self.port = port
        self.requester = Requester(spec["send_psn"], transport["payload_bytes"],
                                   ack_every=transport["ack_every"],
                                   timeout_s=transport["ack_timeout_s"],
                                   retry_limit=transport["retry_limit"])
        self.responder = Responder(spec["recv_psn"])
        self.rp = dcqcn.ReactionPoint(rp_params) if rp_params else None
        self.np = dcqcn.NotificationPoint(rp_params) if rp_params else None
        self.next_allowed = 0.0        # DCQCN's per-QP pacing
        self.min_rate = port.rate_mbps  # the lowest rate DCQCN cut this QP to
        self.queued = False            # in its port's active ring
        self.cnp_received = 0
        self.cnp_sent = 0
        self.ce_seen = 0
        self.first_send = None
        self.last_ack = None
        self.it_first = self.it_last = None  # this iteration: first send, last completion
        self.it_bytes = 0

    def counters(self):
        r, s = self.requester.counters, self.responder.counters
        out = {"qpn": self.qpn, "peer": self.peer, "peer_qpn": self.peer_qpn,
               "channel": self.channel, "sport": self.sport, "plane": self.port.index + 1,
               "tx_packets": r.packets, "tx_bytes": r.bytes,
               "retransmitted_packets": r.retransmitted_packets, "naks_received": r.naks,
               "local_ack_timeout_err": r.local_ack_timeout_err, "messages_completed": r.completed,
               "rx_packets": s.packets, "rx_bytes": s.bytes, "out_of_sequence": s.out_of_sequence,
               "duplicate_request": s.duplicate_request, "packet_seq_err": s.packet_seq_err,
               "acks_sent": s.acks_sent, "ce_marked": self.ce_seen,
               "cnp_sent": self.cnp_sent, "cnp_handled": self.cnp_received,
               "first_send": self.first_send, "last_ack": self.last_ack}
        if self.rp is not None:
            out["dcqcn"] = {**self.rp.counters, "rate_mbps": round(self.rp.rate_mbps, 6),
                            "min_rate_mbps": round(self.min_rate, 6)}
        return out


class Connection:
    """This rank's QPs to one peer on one channel, with QP scaling and CTS credit."""

    def __init__(self, peer, channel, qps):
        self.peer, self.channel, self.qps = peer, channel, qps
        self.rr = 0
        self.pending = deque()          # NIC messages waiting for CTS credit: (qp_parts, bytes)
        self.granted_to_me = 0          # cumulative bytes the peer lets me write (CTS)
        self.posted = 0                 # cumulative bytes I have posted to it
        self.granted_by_me = 0          # cumulative bytes I let the peer write
        self.received = 0               # cumulative bytes the peer wrote to me
        self.cts_due = False
        self.last_cts = 0.0
        self.received_at_cts = 0


class Agent:
    def __init__(self, config):
        self.config = config
        self.rank = config["rank"]
        self.ranks = config["ranks"]
        self.transport = config["transport"]
        self.collective = config["collective"]
        self.sizes = config["sizes"]
        self.verify = config.get("verify", False)
        self.cts = self.transport.get("cts") or {}
        self.ports = []
        self.qps = {}
        self.connections = {}
        self.control = None
        self.selector = selectors.DefaultSelector()
        self.errors = []
        self.schedule = None
        self.memory = None
        self.reference = None
        self.engine = None
        self.early = []                 # completions that arrived before their iteration started
        self.transfer_parts = {}        # tag -> NIC messages not yet acknowledged
        self.start_mono = None
        self.iteration = None
        self.iteration_start = None
        self.counter_mark = None
        self.cpu_mark = 0.0
        self.zero = bytes(self.transport["chunk_bytes"])
        self.control_buffer = b""
        self.stopping = False
        self.next_timer = 0.0
        self.timer_period = min(TIMER_PERIOD_S, self.transport["ack_timeout_s"] / 5)
        self.clock_offset = time.time() - time.monotonic()

    # -- set-up ------------------------------------------------------------------------------------

    def open(self):
        config = self.config
        for index, port in enumerate(config["ports"]):
            self.ports.append(Port(index, port["address"], port["rate_mbps"],
                                   self.transport.get("nic_queue_bytes")))
        params = None
        if self.transport.get("dcqcn"):
            params = dcqcn.DcqcnParams(**self.transport["dcqcn"])
        for spec in config["qps"]:
            qp = QueuePair(spec, self.ports[spec["port"]], self.transport, params)
            self.qps[qp.qpn] = qp
            key = (qp.peer, qp.channel)
            self.connections.setdefault(key, Connection(qp.peer, qp.channel, []))
            self.connections[key].qps.append(qp)
        window = self.cts.get("buffers", 0) * self.transport["chunk_bytes"]
        for conn in self.connections.values():
            if not self.cts.get("enabled"):
                conn.granted_to_me = float("inf")
            else:
                conn.granted_by_me = window
                conn.cts_due = True
        for port in self.ports:
            self.selector.register(port.listener, selectors.EVENT_READ, ("port", port))
        self.connect_launcher(config["control"])
        self.tell({"hello": self.rank, "pid": os.getpid()})

    def connect_launcher(self, path):
        """The control socket to the launcher (its unix socket at `path`), watched by the selector."""
        self.control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.control.connect(path)
        except OSError as exc:
            raise LabError(f"cannot reach the launcher at {path}: {exc.strerror}") from None
        self.control.setblocking(False)
        self.selector.register(self.control, selectors.EVENT_READ, ("control", None))

    def close(self):
        for port in self.ports:
            port.close()
        if self.control:
            self.control.close()

    def tell(self, message):
        data = (json.dumps(message) + "\n").encode()
        self.control.setblocking(True)
        try:
            self.control.sendall(data)
        finally:
            self.control.setblocking(False)

    def describe(self, rank):
        info = self.ranks[rank]
        return f"rank {rank} ({info['host']} {info['addresses'][0]})"

    # -- the collective -------------------------------------------------------------------------

    def prepare(self, size_index):
        c = self.collective
        self.schedule = schedules.build(c["collective"], len(self.ranks), self.sizes[size_index],
                                        algorithm=c["algorithm"], channels=c["channels"],
                                        piece_bytes=c["piece_bytes"], imbalance=c["imbalance"],
                                        seed=c["seed"], root=c["root"])
        self.memory = self.reference = None
        if self.verify:
            import numpy as np
            regions = self.schedule.regions[self.rank]
            self.memory = self.make_memory(regions)
            inputs = [_rank_input(self.config["data_seed"], r,
                                  self.schedule.regions[r].get("input", 0) // 4)
                      for r in range(len(self.ranks))]
            if "input" in regions:
                self.memory.arrays["input"][:] = inputs[self.rank]
            self.reference = schedules.reference_outputs(self.schedule, inputs)[self.rank]
            self.np = np

    def make_memory(self, regions):
        """The rank's memory for one message size (verify mode)."""
        return Memory(regions)

    def run(self, iteration, start_at):
        self.iteration = iteration
        self.start_mono = start_at - self.clock_offset
        self.iteration_start = None
        self.clear_outputs()
        self.counter_mark = self.totals()
        self.cpu_mark = time.process_time()
        for qp in self.qps.values():
            qp.it_first = qp.it_last = None
            qp.it_bytes = 0

    def clear_outputs(self):
        """Zero what the collective writes (verify mode), so a write that never came shows."""
        if self.memory is not None:
            for name in ("output", "work", "scratch"):
                if name in self.memory.bytes:
                    self.memory.arrays[name][:] = 0

    def begin(self, now):
        """start_at has come: start the rank's step DAG."""
        self.start_mono = None
        self.iteration_start = now
        self.transfer_parts = {}
        self.engine = RankEngine(self.schedule.programs[self.rank], self.post_transfer, self.memory)
        early, self.early = self.early, []
        self.engine.start()
        for tag, nbytes in early:
            self.engine.received(tag, nbytes)
        self.check_done(now)

    def post_transfer(self, transfer):
        conn = self.connections[(transfer.dst, transfer.channel)]
        chunk = self.transport["chunk_bytes"]
        method = self.transport["qp_method"]
        messages = 0
        for off in range(0, transfer.nbytes, chunk):
            length = min(chunk, transfer.nbytes - off)
            if method == "split" and len(conn.qps) > 1:
                parts = []
                for i, (o, k) in enumerate(schedules.split(length // 4, len(conn.qps))):
                    if k:
                        parts.append((conn.qps[i], off + o * 4, k * 4))
            else:
                parts = [(conn.qps[conn.rr % len(conn.qps)], off, length)]
                conn.rr += 1
            messages += len(parts)
            conn.pending.append((transfer, parts, length))
        self.transfer_parts[transfer.tag] = messages
        self.admit(conn)

    def admit(self, conn):
        """Post the connection's waiting NIC messages that fit within the peer's CTS grant."""
        while conn.pending and conn.posted + conn.pending[0][2] <= conn.granted_to_me:
            transfer, parts, length = conn.pending.popleft()
            conn.posted += length
            for qp, off, nbytes in parts:
                data = (self.memory.view(transfer.src_region, transfer.src_off + off, nbytes)
                        if self.memory is not None else None)
                qp.requester.post(WriteRequest(
                    nbytes, remote_address(transfer.dst_region, transfer.dst_off + off),
                    rkey=REGION_IDS[transfer.dst_region], immediate=transfer.tag,
                    data=data, context=transfer.tag))
                self.activate(qp)

    def activate(self, qp):
        if not qp.queued and qp.requester.has_packet():
            qp.queued = True
            qp.port.active.append(qp)

    def check_done(self, now):
        if self.engine is None or not self.engine.done:
            return
        self.engine = None
        report = {"done": self.iteration,
                  "start": self.iteration_start + self.clock_offset,
                  "end": now + self.clock_offset,
                  "counters": _delta(self.totals(), self.counter_mark),
                  "cpu_s": round(time.process_time() - self.cpu_mark, 4),
                  "flows": [{"qpn": qp.qpn, "peer": qp.peer, "channel": qp.channel,
                             "plane": qp.port.index + 1, "bytes": qp.it_bytes,
                             "seconds": round(qp.it_last - qp.it_first, 6)}
                            for qp in self.qps.values()
                            if qp.it_bytes and qp.it_last is not None]}
        if self.verify:
            report["verify"] = self.check_output()
        self.tell(report)

    def check_output(self):
        np = self.np
        out = self.memory.arrays.get("output")
        expected = self.reference
        if expected is None:
            return {"ok": True, "elements": 0}
        diff = np.abs(out - expected)
        bad = np.flatnonzero(diff > 0)
        result = {"ok": bad.size == 0, "elements": int(expected.size),
                  "max_abs_err": float(diff.max()) if diff.size else 0.0,
                  "mismatches": int(bad.size)}
        if bad.size:
            i = int(bad[0])
            result["first_mismatch"] = {"index": i, "got": float(out[i]), "want": float(expected[i])}
        return result

    # -- packets ----------------------------------------------------------------------------------

    def send_control(self, qp, packet):
        """ACK/NAK/CNP/CTS: sent at once (they are small), counted against the port's pace."""
        port = qp.port
        try:
            port.sender.sendto(packet, socket.MSG_DONTWAIT, (qp.peer_address, 0))
        except OSError as exc:
            if exc.errno in _BUSY or exc.errno in _UNREACHABLE:
                return            # lost like a dropped packet; timers recover
            raise
        port.next_free = max(port.next_free, time.monotonic()) + (len(packet) + 14) * port.seconds_per_byte

    def control_ip(self):
        return {"dscp": self.transport["control_dscp"], "ecn": roce.ECN_NOT_ECT}

    def pump(self, port, now):
        """Send the port's due packets; return when it next wants to send (or None if idle)."""
        while True:
            if port.next_free > now + SEND_AHEAD_S:
                return port.next_free
            if port.held is not None:
                packet, qp = port.held
            else:
                qp = self._next_qp(port, now)
                if qp is None:
                    return self._earliest_allowed(port)
                packet = self._build(qp, now)
            try:
                port.sender.sendto(packet, socket.MSG_DONTWAIT, (qp.peer_address, 0))
            except OSError as exc:
                port.held = (packet, qp)
                if exc.errno in _BUSY:
                    port.enobufs += 1
                    port.next_free = now + BACKOFF_S
                    return port.next_free
                if exc.errno in _UNREACHABLE:
                    port.send_errors += 1
                    port.next_free = now + UNREACHABLE_BACKOFF_S
                    return port.next_free
                raise LabError(f"sending to {self.describe(qp.peer)} from {port.address} failed: "
                               f"{exc.strerror or exc}") from None
            port.held = None
            wire = len(packet) + roce.ETH_HEADER_LEN
            port.tx_packets += 1
            port.tx_bytes += wire
            port.next_free = max(port.next_free, now - MAX_BURST_S) + wire * port.seconds_per_byte
            if qp.rp is not None:
                qp.rp.on_sent(wire, now)
                qp.next_allowed = max(qp.next_allowed, now - MAX_BURST_S) + wire * 8 / (qp.rp.rate_mbps * 1e6)

    def _next_qp(self, port, now):
        """Round-robin over the port's QPs that have a packet and DCQCN allows now."""
        for _ in range(len(port.active)):
            qp = port.active.popleft()
            if not qp.requester.has_packet():
                qp.queued = False
                continue
            port.active.append(qp)
            if qp.next_allowed <= now + SEND_AHEAD_S:
                return qp
        return None

    def _earliest_allowed(self, port):
        times = [qp.next_allowed for qp in port.active if qp.requester.has_packet()]
        return min(times) if times else None

    def _build(self, qp, now):
        opcode, psn, ack_req, reth, immediate, request, offset, length = qp.requester.next_packet(now)
        if qp.first_send is None:
            qp.first_send = now + self.clock_offset
        if qp.it_first is None:
            qp.it_first = now
        qp.it_bytes += length
        if request.data is not None:
            payload = request.data[offset:offset + length]
        else:
            payload = self.zero[:length]
        if immediate is not None:
            payload = immediate.to_bytes(4, "big") + bytes(payload)
        sport = qp.sports[psn % len(qp.sports)]
        return roce.build_ipv4_udp_roce_packet(
            qp.port.address, qp.peer_address, sport, opcode, qp.peer_qpn, psn, payload,
            reth=reth, ack_req=ack_req, dscp=self.transport["dscp"], ecn=self.transport["ecn"],
            ip_id=qp.port.next_ip_id())

    def receive(self, port, now):
        for _ in range(RECEIVE_BATCH):
            try:
                data, ancillary, _flags, address = port.listener.recvmsg(65536, 64)
            except (BlockingIOError, InterruptedError):
                return
            tos = 0
            for level, kind, value in ancillary:
                if level == socket.IPPROTO_IP and kind == socket.IP_TOS and value:
                    tos = value[0]
            try:
                parsed = roce.parse_roce(data)
            except ValueError:
                continue
            qp = self.qps.get(parsed.bth.dest_qp)
            if qp is None or address[0] != qp.peer_address:
                continue
            self.handle(qp, parsed, data, tos, now)

    def handle(self, qp, parsed, data, tos, now):
        opcode = parsed.bth.opcode
        if opcode == roce.OP_RC_ACKNOWLEDGE:
            qp.last_ack = now + self.clock_offset
            for request in qp.requester.on_ack(parsed.bth.psn, parsed.aeth, now):
                qp.it_last = now
                self.message_sent(request.context)
            self.activate(qp)
            return
        if opcode == roce.OP_CNP:
            qp.cnp_received += 1
            if qp.rp is not None:
                qp.rp.on_cnp(now)
                qp.min_rate = min(qp.min_rate, qp.rp.rate_mbps)
            return
        if opcode == roce.OP_UC_SEND_ONLY:
            granted = roce.parse_cts_payload(data)
            if granted is not None:
                conn = self.connections[(qp.peer, qp.channel)]
                if granted > conn.granted_to_me:
                    conn.granted_to_me = granted
                    self.admit(conn)
            return
        if (tos & 3) == roce.ECN_CE:
            qp.ce_seen += 1
            qp.responder.counters.ce += 1
            if qp.np is not None and qp.np.on_ce(now):
                qp.cnp_sent += 1
                self.send_control(qp, roce.build_cnp_packet(
                    qp.port.address, qp.peer_address, qp.sport, qp.peer_qpn,
                    dscp=self.transport["cnp_dscp"], ecn=roce.ECN_NOT_ECT,
                    ip_id=qp.port.next_ip_id()))
        action = qp.responder.on_packet(parsed)
        if action.placement is not None and self.memory is not None:
            place = action.placement
            region, offset = split_address(place.vaddr)
            start = place.offset_in_payload
            self.memory.write(region, offset, data[start:start + place.length])
        if action.reply is not None:
            psn, syndrome = action.reply
            self.send_control(qp, roce.build_ack_packet(
                qp.port.address, qp.peer_address, qp.sport, qp.peer_qpn, psn, syndrome,
                qp.responder.msn, ip_id=qp.port.next_ip_id(), **self.control_ip()))
        if action.completion is not None:
            done = action.completion
            conn = self.connections[(qp.peer, qp.channel)]
            conn.received += done.length
            if self.cts.get("enabled"):
                conn.granted_by_me += done.length
                conn.cts_due = True
            if self.engine is not None:
                self.engine.received(done.immediate, done.length)
                self.check_done(now)
            else:
                self.early.append((done.immediate, done.length))

    def message_sent(self, tag):
        left = self.transfer_parts.get(tag)
        if left is None:
            return
        if left > 1:
            self.transfer_parts[tag] = left - 1
            return
        del self.transfer_parts[tag]
        if self.engine is not None:
            self.engine.sent(tag)
            self.check_done(time.monotonic())

    def send_cts(self, now):
        refresh = self.cts.get("refresh_s", 0.05)
        running = self.engine is not None
        for conn in self.connections.values():
            # A lost CTS would stall its sender: while an iteration runs, repeat the grant on a
            # connection that has been silent since the last one.
            stalled = running and conn.received == conn.received_at_cts and now - conn.last_cts >= refresh
            if conn.cts_due or stalled:
                conn.cts_due = False
                conn.last_cts = now
                conn.received_at_cts = conn.received
                qp = conn.qps[0]
                self.send_control(qp, roce.build_ipv4_udp_roce_packet(
                    qp.port.address, qp.peer_address, qp.sport, roce.OP_UC_SEND_ONLY, qp.peer_qpn,
                    0, roce.build_cts_payload(conn.granted_by_me), ip_id=qp.port.next_ip_id(),
                    **self.control_ip()))

    def timers(self, now):
        for qp in self.qps.values():
            try:
                if qp.requester.check_timeout(now):
                    self.activate(qp)
            except TransportError as exc:
                raise PeerError(qp.peer, f"{exc} on QP {qp.qpn:#x}") from None
            if qp.rp is not None:
                qp.rp.advance(now)

    # -- counters ---------------------------------------------------------------------------------

    def totals(self):
        keys = ("tx_packets", "tx_bytes", "retransmitted_packets", "naks_received",
                "local_ack_timeout_err", "rx_packets", "rx_bytes", "out_of_sequence",
                "duplicate_request", "packet_seq_err", "acks_sent", "ce_marked", "cnp_sent",
                "cnp_handled")
        total = dict.fromkeys(keys, 0)
        for qp in self.qps.values():
            c = qp.counters()
            for key in keys:
                total[key] += c[key]
        total["enobufs"] = sum(p.enobufs for p in self.ports)
        total["send_errors"] = sum(p.send_errors for p in self.ports)
        return total

    def final(self):
        return {"final": self.rank, "totals": self.totals(), "cpu_s": round(time.process_time(), 3),
                "qps": [qp.counters() for qp in self.qps.values()],
                "ports": [{"address": p.address, "tx_packets": p.tx_packets, "tx_bytes": p.tx_bytes,
                           "enobufs": p.enobufs, "send_errors": p.send_errors} for p in self.ports]}

    # -- the loop ---------------------------------------------------------------------------------

    def serve(self):
        """Run until told to stop or the launcher goes away."""
        while not self.stopping:
            now = time.monotonic()
            if self.start_mono is not None and now >= self.start_mono:
                self.begin(now)
            if now >= self.next_timer:
                self.timers(now)
                self.next_timer = now + self.timer_period
            if self.cts.get("enabled"):
                self.send_cts(now)
            wake = [self.next_timer]
            if self.start_mono is not None:
                wake.append(self.start_mono)
            for port in self.ports:
                due = self.pump(port, now)
                if due is not None:
                    wake.append(due)
            timeout = max(0.0, min(min(wake) - SEND_AHEAD_S, now + MAX_IDLE_WAIT_S) - time.monotonic())
            for key, _mask in self.selector.select(timeout):
                kind, port = key.data
                if kind == "port":
                    self.receive(port, time.monotonic())
                else:
                    self.read_control()

    def read_control(self):
        try:
            chunk = self.control.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        if not chunk:
            raise LauncherGone()
        self.control_buffer += chunk
        while b"\n" in self.control_buffer:
            line, self.control_buffer = self.control_buffer.split(b"\n", 1)
            self.on_control(json.loads(line))

    def on_control(self, message):
        if "prepare" in message:
            self.prepare(message["prepare"])
            self.tell({"ready": message["prepare"]})
        elif "run" in message:
            self.run(message["run"], message["start_at"])
        elif "status" in message:
            self.tell({"status": self.rank, "state": self.status()})
        elif "stop" in message:
            self.tell(self.final())
            self.stopping = True

    def status(self):
        if self.engine is None:
            return {"running": False}
        return {"running": True, "iteration": self.iteration,
                "waiting_for": [{"tag": tag, "from": src, "bytes": missing}
                                for tag, src, missing in self.engine.pending_recvs()[:8]],
                "unacked_sends": self.engine.unacked_sends,
                "cts_blocked": [{"peer": c.peer, "bytes": sum(p[2] for p in c.pending)}
                                for c in self.connections.values() if c.pending]}


class PeerError(Exception):
    def __init__(self, peer, message):
        super().__init__(message)
        self.peer = peer


class LauncherGone(Exception):
    pass


def _rank_input(seed, rank, count):
    """A rank's input tensor: small integers as float32, so every sum is exact in any order."""
    import numpy as np

    rng = np.random.default_rng([seed, rank])
    return rng.integers(-64, 64, count).astype(np.float32)


def _delta(now, mark):
    return {key: value - (mark or {}).get(key, 0) for key, value in now.items()}


def main(argv=None, agent_class=None, module="fabriclab.traffic.agent", prog="fabriclab-agent"):
    """Run one rank's agent (`agent_class`, default Agent) until the launcher stops it."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}",
                                     description="collective agent for one rank (a host NIC)")
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    sockets.die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    try:
        with open(args.config, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        print(f"{prog}: error: cannot read config {args.config}: {exc}", file=sys.stderr)
        return 2
    agent = (agent_class or Agent)(config)
    try:
        agent.open()
        agent.serve()
    except LabError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except PeerError as exc:
        message = f"{agent.describe(agent.rank)}: {exc} towards {agent.describe(exc.peer)}"
        print(f"{prog}: error: {message}", file=sys.stderr)
        try:
            agent.tell({"error": message, "peer": exc.peer})
        except OSError:
            pass
        return 1
    except LauncherGone:
        return 0
    finally:
        agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
