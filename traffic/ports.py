"""A NIC port on raw sockets: the packet I/O of the lab's RNICs.

`RawPort` sends whole IPv4 RoCEv2 datagrams (built by `roce`) through a raw socket bound to the
port's address, applies `send_policy` to refused sends and counts them, and carries the port's
`Pace` (its line rate, or unpaced). With `listen()` it also receives the RoCEv2 datagrams
addressed to it. `IpIds` numbers the IPv4 headers of raw packets.
"""

from __future__ import annotations

import socket
from typing import NamedTuple

from fabriclab.traffic import roce, send_policy, sockets
from fabriclab.traffic.pacer import Pace

RECEIVE_BATCH = 64
"""Datagrams read per readiness event, so a burst does not starve the sender for long."""


class IpIds:
    """The IPv4 ID counter of a stream of raw packets: 16 bits that wrap and skip 0.

    Linux fills in the ID of an IP_HDRINCL packet whose ID is 0, which would change bytes the
    ICRC covers."""

    __slots__ = ("next_id",)

    def __init__(self, first=1):
        self.next_id = first

    def take(self):
        ip_id = self.next_id
        self.next_id = ip_id % 0xFFFF + 1
        return ip_id


class Refusal(NamedTuple):
    """A send the stack refused: its `send_policy` kind and the error."""

    kind: str
    error: OSError


class RawPort:
    """One NIC port: a raw IPv4 socket bound to `address` (so `ip rule from <address>` picks
    the NIC), its pace and its counters.

    `what` names the port's user in errors (a flow, a rank's port). `send_buffer` bounds the
    bytes the kernel queues for it (see `sockets.open_raw_sender`)."""

    def __init__(self, address, what, rate_mbps=None, send_buffer=None):
        self.address = address
        self.pace = Pace(rate_mbps)
        self.sender = sockets.open_raw_sender(address, what, send_buffer)
        self.listener = None
        self.tx_packets = 0
        self.tx_bytes = 0
        self.enobufs = 0          # sends refused by a full queue
        self.send_errors = 0      # sends refused for want of a route
        # Out-of-turn packets a full queue refused, kept to go first when it has room again:
        # key -> (packet, dst), oldest first (see transmit_out_of_turn).
        self.held = {}
        self.held_packets = 0     # how many were held so (a PFC pause on this port, mostly)

    def listen(self):
        """Receive RoCEv2 datagrams addressed to this port (non-blocking: see `receive`)."""
        self.listener = sockets.open_roce_listener(self.address)
        self.listener.setblocking(False)
        return self.listener

    def close(self):
        self.sender.close()
        if self.listener is not None:
            self.listener.close()

    def transmit(self, packet, dst):
        """Send one datagram now; None when it went, else a Refusal (counted here)."""
        try:
            self.sender.sendto(packet, socket.MSG_DONTWAIT, (dst, 0))
        except OSError as exc:
            kind = send_policy.classify(exc)
            if kind is send_policy.BUSY:
                self.enobufs += 1
            elif kind is send_policy.UNREACHABLE:
                self.send_errors += 1
            return Refusal(kind, exc)
        self.tx_packets += 1
        self.tx_bytes += len(packet) + roce.ETH_HEADER_LEN
        return None

    def transmit_out_of_turn(self, packet, dst, now, hold_as=None):
        """Send a packet that cannot wait for its turn (an ACK, a CNP, a CTS) and charge it to
        the port's pace. A fatal refusal is returned. A busy one (the port's queue is full: on a
        lossless fabric, a PFC pause holds it) keeps a packet given a key `hold_as` until the
        queue has room (`send_held`), as an RNIC keeps the ACKs it generates while its port is
        paused instead of dropping them; a later packet of the same key replaces it (a QP's
        cumulative ACK says all an earlier one did). Without a key, a busy or unreachable
        refusal loses the packet, as a dropped packet is lost (the transport's timers recover)."""
        if hold_as is not None and self.held and not self.send_held(now):
            self._hold(hold_as, packet, dst)          # the queue is still full: wait behind them
            return None
        refusal = self.transmit(packet, dst)
        if refusal is None:
            self.pace.charge_out_of_turn(len(packet) + roce.ETH_HEADER_LEN, now)
            return None
        if refusal.kind is send_policy.BUSY and hold_as is not None:
            self._hold(hold_as, packet, dst)
            return None
        return refusal if refusal.kind is send_policy.FATAL else None

    def _hold(self, key, packet, dst):
        self.held.pop(key, None)                      # the newer one goes last, in order
        self.held[key] = (packet, dst)
        self.held_packets += 1

    def send_held(self, now):
        """Send the held out-of-turn packets, oldest first; False when the queue is still full
        (what is left stays held). A packet refused for another reason is dropped."""
        held = self.held
        while held:
            key = next(iter(held))
            packet, dst = held[key]
            refusal = self.transmit(packet, dst)
            if refusal is not None and refusal.kind is send_policy.BUSY:
                return False
            del held[key]
            if refusal is None:
                self.pace.charge_out_of_turn(len(packet) + roce.ETH_HEADER_LEN, now)
        return True

    def queued_bytes(self):
        """Bytes of this port's packets waiting in its qdisc: the local egress queue."""
        return sockets.queued_bytes(self.sender)

    def receive(self):
        """Up to RECEIVE_BATCH waiting datagrams as (UDP payload, source address, TOS byte,
        UDP source port)."""
        recvmsg = self.listener.recvmsg
        read_ancillary = sockets.read_ancillary
        for _ in range(RECEIVE_BATCH):
            try:
                data, ancillary, _flags, address = recvmsg(65536, sockets.ANCILLARY_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            yield data, address[0], read_ancillary(ancillary)[0], address[1]

    def report(self):
        return {"address": self.address, "tx_packets": self.tx_packets, "tx_bytes": self.tx_bytes,
                "enobufs": self.enobufs, "send_errors": self.send_errors, "held_packets": self.held_packets}
