"""What one host receives of RoCEv2 traffic, counted per flow: the all-pairs generator's receiver.

`ReceiveCounters` is the arithmetic (per flow: packets, bytes, PSN order, ECN CE marks), tested
on crafted datagrams; `Receiver` feeds it from a UDP 4791 socket with the kernel's arrival
times; `ReceiverProcess` runs a Receiver in a forked child so that receiving and sending do not
share one GIL.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

from fabriclab.traffic import roce, sockets

RECEIVE_POLL_S = 0.1
"""How often a waiting receiver checks whether it should stop."""


class _FlowCounter:
    __slots__ = ("src", "sport", "dst", "dst_qpn", "packets", "bytes", "wire_bytes", "oos", "late",
                 "ce", "first", "last", "expected_psn")

    def __init__(self, src, sport, dst, dst_qpn):
        self.src, self.sport, self.dst, self.dst_qpn = src, sport, dst, dst_qpn
        self.packets = self.bytes = self.wire_bytes = self.oos = self.late = self.ce = 0
        self.first = self.last = None
        self.expected_psn = None

    def as_dict(self):
        return {"src": self.src, "sport": self.sport, "dst": self.dst, "dst_qpn": self.dst_qpn,
                "packets": self.packets, "bytes": self.bytes, "wire_bytes": self.wire_bytes,
                "oos": self.oos, "late": self.late, "ce": self.ce,
                "first": self.first, "last": self.last}


class ReceiveCounters:
    """Per-flow receive counters, keyed by (source address, source UDP port, destination QP).

    PSN tracking follows an RC responder: a packet with the expected PSN advances it; one ahead
    of it (a gap: loss, or reordering) counts as out of sequence and the tracker resynchronises
    on it; one behind it (a duplicate, or a packet overtaken by later ones) counts as out of
    sequence and late, and leaves the expected PSN alone. One swapped pair of packets therefore
    shows as oos=2, late=1.
    """

    def __init__(self):
        self.counters = {}
        self.malformed = 0

    def add(self, data, length, src, sport, dst, tos, arrival):
        """Count one UDP payload `data[:length]` from src:sport to the local address dst."""
        if length < roce.BTH_LEN + roce.ICRC_LEN:
            self.malformed += 1
            return
        bth = roce.parse_bth(data)
        payload = roce.roce_payload_length(length, bth)
        if payload < 0:
            self.malformed += 1
            return
        key = (src, sport, bth.dest_qp)
        counter = self.counters.get(key)
        if counter is None:
            counter = self.counters[key] = _FlowCounter(src, sport, dst, bth.dest_qp)
            counter.first = arrival
        counter.packets += 1
        counter.bytes += payload
        counter.wire_bytes += (length + roce.UDP_HEADER_LEN + roce.IPV4_HEADER_LEN
                               + roce.ETH_HEADER_LEN)
        counter.last = arrival
        if (tos & 3) == roce.ECN_CE:
            counter.ce += 1
        expected = counter.expected_psn
        if expected is None or bth.psn == expected:
            counter.expected_psn = roce.psn_add(bth.psn)
        elif roce.psn_behind(bth.psn, expected):
            counter.oos += 1
            counter.late += 1
        else:
            counter.oos += 1
            counter.expected_psn = roce.psn_add(bth.psn)

    def result(self):
        return [self.counters[key].as_dict() for key in sorted(self.counters)]


class Receiver:
    """Counts RoCEv2 packets arriving on UDP port 4791, per (source address, source port, dest QP).

    Binding 0.0.0.0:4791 also keeps the kernel from answering each packet with an ICMP port
    unreachable. IP_PKTINFO gives the destination address, IP_RECVTOS the ECN bits (CE marks made
    by the fabric), SO_TIMESTAMPNS the kernel's arrival time.
    """

    def __init__(self):
        self.counts = ReceiveCounters()
        self.sock = sockets.open_roce_listener(destinations=True, timestamps=True)
        self.sock.settimeout(RECEIVE_POLL_S)

    def close(self):
        self.sock.close()

    def run(self, stop_event, until_mono, quiet=None):
        """Count until `until_mono`, or, with quiet = (from_mono, quiet_s), until nothing has
        arrived for quiet_s since from_mono (the senders' end) or since the last arrival."""
        buffer = bytearray(65536)
        recvmsg_into = self.sock.recvmsg_into
        quiet_from, quiet_s = quiet if quiet else (until_mono, 0.0)
        last = quiet_from
        while not stop_event.is_set():
            now = time.monotonic()
            if now >= until_mono or (quiet and now - last >= quiet_s):
                break
            try:
                length, ancillary, flags, address = recvmsg_into([buffer], sockets.ANCILLARY_SPACE)
            except socket.timeout:
                continue
            except InterruptedError:
                continue
            if quiet:
                last = max(last, time.monotonic())
            tos, dst, arrival = sockets.read_ancillary(ancillary)
            if arrival is None:
                arrival = time.time()
            if flags & socket.MSG_TRUNC:
                self.counts.malformed += 1
                continue
            self.counts.add(buffer, length, address[0], address[1], dst, tos, arrival)

    def result(self):
        return self.counts.result()


class ReceiverProcess:
    """Runs a `Receiver` in a forked child process and hands its counters back through a pipe.

    Sending and receiving in one Python process would share one GIL: a receiver busy with a
    burst delays the sender's wake-ups (and the other way round), which shows up as pacing error
    on hosts that send and receive at once, as every host of a collective does. Two processes
    let the kernel schedule them on different cores. The child stops at its deadline, on SIGTERM
    or SIGINT (the parent forwards its own), and when the parent dies.
    """

    def __init__(self, receiver):
        self.receiver = receiver
        self.pid = None
        self.read_fd = None

    def start(self, until_mono, quiet=None):
        read_fd, write_fd = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            self._child(write_fd, until_mono, parent, quiet)
        os.close(write_fd)
        self.receiver.close()          # the child owns the socket now
        self.pid, self.read_fd = pid, read_fd

    def _child(self, write_fd, until_mono, parent, quiet=None):
        status = 0
        try:
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            signal.signal(signal.SIGINT, lambda *_: stop.set())
            sockets.die_with_parent()
            if os.getppid() != parent:         # the parent died before prctl took effect
                stop.set()
            try:
                self.receiver.run(stop, until_mono, quiet)
                report = {"received": self.receiver.result(),
                          "malformed": self.receiver.counts.malformed}
            except Exception as exc:           # reported by the parent as a run error
                report = {"error": f"receiver failed: {exc!r}"}
                status = 1
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(json.dumps(report).encode())
        finally:
            os._exit(status)

    def stop(self):
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def collect(self):
        """Wait for the child; return its report ({"received", "malformed"} or {"error"})."""
        chunks = []
        with os.fdopen(self.read_fd, "rb") as pipe:
            while True:
                chunk = pipe.read(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        os.waitpid(self.pid, 0)
        self.pid = None
        try:
            return json.loads(b"".join(chunks))
        except ValueError:
            return {"error": "receiver process ended without a report"}
