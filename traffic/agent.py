"""The collective agent on raw sockets: one per rank (a host NIC), the lab's own RNIC under the
shared rank driver.

Runs inside a Mininet host's network namespace::

    python -m fabriclab.traffic.agent --config RANK.json

and speaks the launcher's protocol (see `rank_driver`, which also cuts transfers into NIC
messages and spreads them over QPs).

Data path (`UdpRnic`): per port (one per plane) a `ports.RawPort` paced at the port's line rate
and a `pacer.Pacer` serving its QPs in turn, as an RNIC's scheduler does, each QP optionally
limited by DCQCN; per QP a `transport.Requester` and `transport.Responder`, packets built by
`roce`. A NIC message is an RDMA WRITE with immediate (the transfer's tag). ACKs, NAKs, CNPs and
CTS grants go out of turn, charged to the port's pace.

Errors: as `rank_driver` says; a send the stack refuses follows `send_policy`.
"""

from __future__ import annotations

import sys
import time

from fabriclab.errors import LabError
from fabriclab.traffic import dcqcn, rank_driver, roce, send_policy
from fabriclab.traffic.engine import REGION_IDS, Memory, remote_address, split_address
from fabriclab.traffic.pacer import Pace, Pacer
from fabriclab.traffic.ports import IpIds, RawPort
from fabriclab.traffic.rank_driver import PeerError, QpActivity
from fabriclab.traffic.transport import Requester, Responder, TransportError, WriteRequest

__all__ = ("UdpRnic", "main")

TIMER_PERIOD_S = 0.02
"""How often ACK timeouts and DCQCN timers are checked: well inside the shortest sensible ACK
timeout, and rare enough that an idle agent costs little CPU (it wakes for packets anyway)."""


class Plane:
    """One NIC port: its raw socket port, the pacer over its QPs, its IPv4 ID counter."""

    def __init__(self, index, address, rate_mbps, send_buffer):
        self.index = index
        self.rate_mbps = rate_mbps
        self.port = RawPort(address, f"port {address}", rate_mbps, send_buffer)
        self.port.listen()
        self.pacer = Pacer(self.port)
        self.ip_ids = IpIds()

    def close(self):
        self.port.close()


class QueuePair:
    """A local QP connected to a peer's QP: both RC halves, DCQCN state, counters. Its send
    queue is a `pacer` sender on its plane."""

    def __init__(self, spec, plane, transport, rp_params, peer_name, clock_offset):
        self.qpn = spec["qpn"]
        self.peer = spec["peer"]
        self.peer_qpn = spec["peer_qpn"]
        self.peer_address = self.dst = spec["peer_address"]
        self.channel = spec["channel"]
        self.sport = spec["sport"]
        self.peer_name = peer_name
        self.clock_offset = clock_offset
        # Packet spraying: a multipath NIC varies the source port per packet so ECMP spreads one
        # QP over paths; the RC transport here does not tolerate the reordering that follows.
        spray = transport.get("spray", 1)
        self.sports = [roce.ROCE_UDP_SPORT_MIN | ((self.sport + i * 0x1111) & 0x3FFF)
                       for i in range(spray)]
        self.plane = plane
        self.port_index = plane.index
        self.dscp, self.ecn = transport["dscp"], transport["ecn"]
        self.zero = bytes(transport["chunk_bytes"])
        self.requester = Requester(spec["send_psn"], transport["payload_bytes"],
                                   ack_every=transport["ack_every"],
                                   timeout_s=transport["ack_timeout_s"],
                                   retry_limit=transport["retry_limit"])
        self.responder = Responder(spec["recv_psn"])
        self.rp = dcqcn.ReactionPoint(rp_params) if rp_params else None
        self.np = dcqcn.NotificationPoint(rp_params) if rp_params else None
        self.pace = Pace(self.rp.rate_mbps) if self.rp else None   # DCQCN's per-QP limit
        self.min_rate = plane.rate_mbps                           # the lowest rate DCQCN set
        self.held = None
        self.queued = False
        self.activity = QpActivity()
        self.cnp_received = 0
        self.cnp_sent = 0
        self.ce_seen = 0

    # -- the pacer's sender ---------------------------------------------------------------------

    def has_packet(self):
        return self.requester.has_packet()

    def next_packet(self, now):
        opcode, psn, ack_req, reth, immediate, request, offset, length = \
            self.requester.next_packet(now)
        self.activity.sending(length, now, self.clock_offset)
        if request.data is not None:
            payload = request.data[offset:offset + length]
        else:
            payload = self.zero[:length]
        if immediate is not None:
            payload = immediate.to_bytes(4, "big") + bytes(payload)
        return roce.build_ipv4_udp_roce_packet(
            self.plane.port.address, self.peer_address, self.sports[psn % len(self.sports)],
            opcode, self.peer_qpn, psn, payload, reth=reth, ack_req=ack_req, dscp=self.dscp,
            ecn=self.ecn, ip_id=self.plane.ip_ids.take())

    def sent(self, wire, now):
        if self.rp is not None:
            self.rp.on_sent(wire, now)
            self.pace.set_rate(self.rp.rate_mbps)
            self.pace.charge(wire, now)

    def refused(self, refusal, _now):
        if refusal.kind is send_policy.FATAL:
            detail = send_policy.failure_detail(refusal.error, len(self.held), self.peer_address)
            raise LabError(f"{self.plane.port.address} towards {self.peer_name}: {detail}")

    # -- counters -------------------------------------------------------------------------------

    def counters(self):
        r, s = self.requester.counters, self.responder.counters
        out = {"qpn": self.qpn, "peer": self.peer, "peer_qpn": self.peer_qpn,
               "channel": self.channel, "sport": self.sport, "plane": self.port_index + 1,
               "tx_packets": r.packets, "tx_bytes": r.bytes,
               "retransmitted_packets": r.retransmitted_packets, "naks_received": r.naks,
               "local_ack_timeout_err": r.local_ack_timeout_err, "messages_completed": r.completed,
               "rx_packets": s.packets, "rx_bytes": s.bytes, "out_of_sequence": s.out_of_sequence,
               "duplicate_request": s.duplicate_request, "packet_seq_err": s.packet_seq_err,
               "acks_sent": s.acks_sent, "ce_marked": self.ce_seen,
               "cnp_sent": self.cnp_sent, "cnp_handled": self.cnp_received,
               "first_send": self.activity.first_send, "last_ack": self.activity.last_ack}
        if self.rp is not None:
            out["dcqcn"] = {**self.rp.counters, "rate_mbps": round(self.rp.rate_mbps, 6),
                            "min_rate_mbps": round(self.min_rate, 6)}
        return out


TOTAL_KEYS = ("tx_packets", "tx_bytes", "retransmitted_packets", "naks_received",
              "local_ack_timeout_err", "rx_packets", "rx_bytes", "out_of_sequence",
              "duplicate_request", "packet_seq_err", "acks_sent", "ce_marked", "cnp_sent",
              "cnp_handled")


class UdpRnic:
    """The lab's RNIC on raw sockets, for `rank_driver.RankDriver`."""

    def __init__(self, config, driver):
        self.config = config
        self.driver = driver
        self.transport = config["transport"]
        self.planes = []
        self.qps = {}
        self.next_timer = 0.0
        self.timer_period = min(TIMER_PERIOD_S, self.transport["ack_timeout_s"] / 5)
        self.control_ip = {"dscp": self.transport["control_dscp"], "ecn": roce.ECN_NOT_ECT}

    def open(self):
        transport = self.transport
        for index, port in enumerate(self.config["ports"]):
            self.planes.append(Plane(index, port["address"], port["rate_mbps"],
                                     transport.get("nic_queue_bytes")))
        params = dcqcn.DcqcnParams(**transport["dcqcn"]) if transport.get("dcqcn") else None
        for spec in self.config["qps"]:
            qp = QueuePair(spec, self.planes[spec["port"]], transport, params,
                           self.driver.describe(spec["peer"]), self.driver.clock_offset)
            self.qps[qp.qpn] = qp
        return list(self.qps.values())

    def hello(self):
        return {}

    def selectables(self):
        return [(plane.port.listener, lambda now, plane=plane: self.receive(plane, now))
                for plane in self.planes]

    def on_control(self, _message):
        return None

    def make_memory(self, regions):
        return Memory(regions)

    def check_schedule(self, _schedule):
        pass

    def close(self):
        for plane in self.planes:
            plane.close()

    # -- sending ----------------------------------------------------------------------------------

    def post(self, qp, message, data):
        qp.requester.post(WriteRequest(
            message.nbytes, remote_address(message.dst_region, message.dst_offset),
            rkey=REGION_IDS[message.dst_region], immediate=message.tag, data=data,
            context=message.tag))
        self.activate(qp, time.monotonic())

    def activate(self, qp, now):
        if not qp.queued and qp.requester.has_packet():
            qp.plane.pacer.activate(qp, now)

    def send_control(self, qp, packet, now):
        """ACK/NAK/CNP/CTS: sent at once (they are small), counted against the port's pace."""
        refusal = qp.plane.port.transmit_out_of_turn(packet, qp.peer_address, now)
        if refusal is not None:
            detail = send_policy.failure_detail(refusal.error, len(packet), qp.peer_address)
            raise LabError(f"{qp.plane.port.address} towards {qp.peer_name}: {detail}")

    def poll(self, now):
        """Fire due timers, grant CTS credit, send what is due; when to be called again."""
        if now >= self.next_timer:
            self.timers(now)
            self.next_timer = now + self.timer_period
        if self.driver.cts_enabled:
            self.send_cts(now)
        wake = self.next_timer
        for plane in self.planes:
            due = plane.pacer.pump(now)
            if due is not None and due < wake:
                wake = due
        return wake

    def send_cts(self, now):
        refresh = self.driver.cts.get("refresh_s", 0.05)
        running = self.driver.running
        for conn in self.driver.connections.values():
            # A lost CTS would stall its sender: while an iteration runs, repeat the grant on a
            # connection that has been silent since the last one.
            stalled = (running and conn.received == conn.received_at_cts
                       and now - conn.last_cts >= refresh)
            if conn.cts_due or stalled:
                conn.cts_due = False
                conn.last_cts = now
                conn.received_at_cts = conn.received
                qp = conn.qps[0]
                self.send_control(qp, roce.build_ipv4_udp_roce_packet(
                    qp.plane.port.address, qp.peer_address, qp.sport, roce.OP_UC_SEND_ONLY,
                    qp.peer_qpn, 0, roce.build_cts_payload(conn.granted_by_me),
                    ip_id=qp.plane.ip_ids.take(), **self.control_ip), now)

    def timers(self, now):
        for qp in self.qps.values():
            try:
                if qp.requester.check_timeout(now):
                    self.activate(qp, now)
            except TransportError as exc:
                raise PeerError(qp.peer, f"{exc} on QP {qp.qpn:#x}") from None
            if qp.rp is not None:
                qp.rp.advance(now)

    # -- receiving --------------------------------------------------------------------------------

    def receive(self, plane, now):
        for data, src, tos in plane.port.receive():
            try:
                parsed = roce.parse_roce(data)
            except ValueError:
                continue
            qp = self.qps.get(parsed.bth.dest_qp)
            if qp is None or src != qp.peer_address:
                continue
            self.handle(qp, parsed, data, tos, now)

    def handle(self, qp, parsed, data, tos, now):
        driver = self.driver
        opcode = parsed.bth.opcode
        if opcode == roce.OP_RC_ACKNOWLEDGE:
            qp.activity.acknowledged(now, driver.clock_offset)
            for request in qp.requester.on_ack(parsed.bth.psn, parsed.aeth, now):
                qp.activity.completed(now)
                driver.message_sent(request.context, now)
            self.activate(qp, now)
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
                driver.grant(driver.connections[(qp.peer, qp.channel)], granted)
            return
        if (tos & 3) == roce.ECN_CE:
            qp.ce_seen += 1
            qp.responder.counters.ce += 1
            if qp.np is not None and qp.np.on_ce(now):
                qp.cnp_sent += 1
                self.send_control(qp, roce.build_cnp_packet(
                    qp.plane.port.address, qp.peer_address, qp.sport, qp.peer_qpn,
                    dscp=self.transport["cnp_dscp"], ecn=roce.ECN_NOT_ECT,
                    ip_id=qp.plane.ip_ids.take()), now)
        action = qp.responder.on_packet(parsed)
        if action.placement is not None and driver.memory is not None:
            place = action.placement
            region, offset = split_address(place.vaddr)
            start = place.offset_in_payload
            driver.memory.write(region, offset, data[start:start + place.length])
        if action.reply is not None:
            psn, syndrome = action.reply
            self.send_control(qp, roce.build_ack_packet(
                qp.plane.port.address, qp.peer_address, qp.sport, qp.peer_qpn, psn, syndrome,
                qp.responder.msn, ip_id=qp.plane.ip_ids.take(), **self.control_ip), now)
        if action.completion is not None:
            done = action.completion
            driver.message_received(qp, done.immediate, done.length, now)

    # -- counters ---------------------------------------------------------------------------------

    def totals(self):
        total = dict.fromkeys(TOTAL_KEYS, 0)
        for qp in self.qps.values():
            c = qp.counters()
            for key in TOTAL_KEYS:
                total[key] += c[key]
        total["enobufs"] = sum(p.port.enobufs for p in self.planes)
        total["send_errors"] = sum(p.port.send_errors for p in self.planes)
        return total

    def qp_counters(self):
        return [qp.counters() for qp in self.qps.values()]

    def port_reports(self):
        return [plane.port.report() for plane in self.planes]

    def status(self):
        return {}


def main(argv=None):
    return rank_driver.main(argv, UdpRnic, module="fabriclab.traffic.agent",
                            prog="fabriclab-agent")


if __name__ == "__main__":
    sys.exit(main())
