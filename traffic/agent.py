"""The collective agent on raw sockets: one per rank (a host NIC), the lab's own RNIC under the
shared rank driver.

Runs inside a Mininet host's network namespace::

    python -m fabriclab.traffic.agent --config RANK.json

and speaks the launcher's protocol (see `rank_driver`, which also cuts transfers into NIC
messages and spreads them over QPs).

Data path (`UdpRnic`): per port (one per plane) a `ports.RawPort` paced at the port's line rate
and a `pacer.Pacer` serving the QPs' `Lane`s in turn, as an RNIC's scheduler does; per QP a
`transport.Requester` and a responder, packets built by `roce`. A NIC message is an RDMA WRITE
with immediate (the transfer's tag). ACKs, NAKs, CNPs, CTS grants and plane probes go out of
turn, charged to the port's pace, on the plane the packet they answer came in by.

Planes (`plb` in the transport config, see `plb`): a QP of a plane-bound mode (static, software)
has a lane on its plane and is limited by its own congestion control (DCQCN or SPX, the
transport's `cc_kind`: `traffic/cc.py`), if any; a multipath QP (per-plane,
global, esr) has a lane on every plane, each limited by its destination's CC context for that
plane, so the packet goes to a plane whose allowance lasts, taken by the first port with room in
its egress queue (the JSQ of seed 002 Figure 4, done by pulling: each port takes the next packet
when its own queue has room); ESR's lane is the one its next entropy names. A plane fails
locally when a send on its port is refused as unreachable or its interface loses its carrier
(netlink), remotely after `probe_timeouts` probe timeouts towards a destination; a multipath QP
then resends what it had on that plane on the others.

SPX CC (`cc_kind` spx) takes RTT samples: every context (a QP's own, or a destination's per plane
or global) with data in flight keeps one RTT probe outstanding, a UC SEND in the data class (so
it queues behind the data it measures, not ECN-capable), echoed at once by the peer on the plane
it came by; the echo's sample goes to the context's reaction point (`spxcc`). A global context
sends its probes on the usable planes in turn, so its one rate hears every plane's delay.

Errors: as `rank_driver` says; a send the stack refuses follows `send_policy`.
"""

from __future__ import annotations

import functools
import socket
import sys
import time

from fabriclab.errors import LabError
from fabriclab.traffic import cc, dcqcn, plb, rank_driver, roce, send_policy, sockets, spxcc
from fabriclab.traffic.engine import REGION_IDS, Memory, remote_address, split_address
from fabriclab.traffic.pacer import SEND_AHEAD_S, Pace, Pacer
from fabriclab.traffic.ports import IpIds, RawPort
from fabriclab.traffic.rank_driver import PeerError, QpActivity
from fabriclab.traffic.transport import (PlacingResponder, Requester, Responder, TransportError,
                                         WriteRequest)

__all__ = ("UdpRnic", "main")

RTT_QP = 0xFF
"""An RTT probe's context index for a QP's own reaction point (plane indexes name the planes')."""
RTT_PROBE_PACKETS = 8
"""SPX: a context probes its RTT once per this many full data packets it sent, at most. Probing
once per round trip, as a 400G NIC can for a few bytes in 250 KB, sent 11 probes per data packet
at the lab's rates, where a round trip (tens of ms, mostly the agents' own latency) is shorter than
a packet's time on a slow plane: Open vSwitch's thread saturated the CPU (2026-12-02,
multiplane-asymmetry --quick --cc spx: 88755 probes beside 8127 data packets)."""

TIMER_PERIOD_S = 0.02
"""How often ACK timeouts and DCQCN timers are checked: well inside the shortest sensible ACK
timeout, and rare enough that an idle agent costs little CPU (it wakes for packets anyway).
Probing modes check four times per probe interval, so a timeout is seen within a quarter of it."""


class Plane:
    """One NIC port: its raw socket port, the pacer over its lanes, its IPv4 ID counter, whether
    it is up (as this NIC sees its own port) and what data it sent."""

    def __init__(self, index, config, send_buffer, room_bytes, frame_s, listen=True):
        self.index = index
        self.rate_mbps = config["rate_mbps"]
        self.intf = config.get("intf")
        self.port = RawPort(config["address"], f"port {config['address']}", self.rate_mbps,
                            send_buffer)
        if listen:
            self.port.listen()
        self.pacer = Pacer(self.port)
        self.ip_ids = IpIds()
        self.up = True
        self.room_bytes = room_bytes      # JSQ: a deeper egress queue takes no packet now
        self.frame_s = frame_s            # the time one full frame takes to leave at line rate
        self.data_packets = self.data_bytes = 0
        self.deep = 0                     # pumps skipped for a deep egress queue

    def close(self):
        self.port.close()

    def report(self):
        return {"plane": self.index + 1, "intf": self.intf, "up": self.up,
                "data_tx_packets": self.data_packets, "data_tx_bytes": self.data_bytes,
                "deep_queue_skips": self.deep}


class Lane:
    """One QP's send queue as seen by one plane's pacer (a `pacer.Pacer` sender): the QP builds
    the packet for this plane. `pace` is what limits the QP there (its own DCQCN, its
    destination's CC context for the plane, or None); `has_packet` is the mode's rule for
    whether the QP sends on this plane now."""

    __slots__ = ("qp", "plane", "index", "pace", "held", "queued", "dst", "has_packet",
                 "next_packet", "sent", "refused")

    def __init__(self, qp, plane, pace, has_packet):
        self.qp = qp
        self.plane = plane
        self.index = plane.index
        self.pace = pace
        self.held = None
        self.queued = False
        self.dst = qp.peer_addresses[plane.index]
        self.has_packet = has_packet
        # the pacer's calls, bound once (a partial costs less than a method that forwards)
        self.next_packet = functools.partial(qp.next_packet, self)
        self.sent = functools.partial(qp.sent, self)
        self.refused = functools.partial(qp.refused, self)


class QueuePair:
    """A local QP connected to a peer's QP: both RC halves, DCQCN state, counters, and a lane
    per plane it may send on."""

    def __init__(self, spec, rnic, dest, rp_params, np_params, peer_name):
        transport = rnic.transport
        self.rnic = rnic
        self.qpn = spec["qpn"]
        self.peer = spec["peer"]
        self.peer_qpn = spec["peer_qpn"]
        self.peer_addresses = tuple(spec.get("peer_addresses") or [spec["peer_address"]])
        self.peer_set = frozenset(self.peer_addresses)
        self.channel = spec["channel"]
        self.sport = spec["sport"]
        self.peer_name = peer_name
        self.clock_offset = rnic.driver.clock_offset
        self.dest = dest
        self.mode = rnic.mode
        self.multipath = self.mode in plb.MULTIPATH
        self.home = spec["port"]
        self.current = self.home              # plane-bound modes: the plane it sends on now
        self.port_index = None if self.multipath else self.home
        self.usable = True                    # software: its plane is not given up on
        self.progress_at = None               # software: the last ACK progress (or start)
        # The receiver places packets that arrive ahead of the expected PSN instead of NAKing
        # them (a multipath QP always does; its packets overtake each other across planes).
        self.placing = self.multipath or transport.get("reorder") == "place"
        # Packet spraying: the NIC varies the source port per packet so ECMP spreads one QP
        # over paths; without placement the reordering that follows costs go-back-N.
        spray = transport.get("spray", 1)
        self.sports = [roce.ROCE_UDP_SPORT_MIN | ((self.sport + i * 0x1111) & 0x3FFF)
                       for i in range(spray)]
        self.dscp, self.ecn = transport["dscp"], transport["ecn"]
        self.zero = bytes(transport["chunk_bytes"])
        payload = transport["payload_bytes"]
        window = None
        if self.placing:
            # A message starts only while the responder's bitmap still holds all of it.
            window = plb.REORDER_WINDOW - -(-transport["chunk_bytes"] // payload)
        self.requester = Requester(spec["send_psn"], payload,
                                   ack_every=transport["ack_every"],
                                   timeout_s=transport["ack_timeout_s"],
                                   retry_limit=transport["retry_limit"],
                                   self_describing=self.placing, window=window)
        self.responder = (PlacingResponder(spec["recv_psn"], plb.REORDER_WINDOW,
                                           transport.get("reorder_timeout_s")) if self.placing
                          else Responder(spec["recv_psn"]))
        self.rp = cc.reaction_point(rp_params) if rp_params else None
        # SPX: the QP's own RTT probe (multipath QPs' probes belong to their contexts)
        self.rtt_probe = (spxcc.RttProbe(rnic.plb.get("probe_interval_s", 0.05), rnic.rtt_probe_bytes)
                          if rp_params and cc.of_params(rp_params).uses_rtt else None)
        # The notification point spaces CNPs per QP, and per plane where the sender keeps a CC
        # context per plane: each context then hears of its plane's marks as often as a
        # one-plane QP would, where one NP for all would make each plane's context hear a
        # quarter of them and the global context (one NP) all of them.
        if not np_params:
            self.nps = None
        elif self.mode == "per-plane":
            self.nps = [dcqcn.NotificationPoint(np_params) for _ in rnic.planes]
        else:
            self.nps = [dcqcn.NotificationPoint(np_params)] * len(rnic.planes)
        self.pace = Pace(self.rp.rate_mbps) if self.rp else None   # DCQCN's per-QP limit
        self.min_rate = rnic.planes[self.home].rate_mbps          # the lowest rate DCQCN set
        self.esr_plane = self.esr_sport = None
        self.activity = QpActivity()
        self.cnp_received = 0
        self.cnp_sent = 0
        self.ce_seen = 0
        self.lanes = [None] * len(rnic.planes)
        # A peer on this host is reached through the host (the scale-up domain), not the NIC:
        # its lanes take the scale-up senders, so they do not queue behind the NIC's pace.
        planes = rnic.scale_up if spec.get("local") and rnic.scale_up else rnic.planes
        for plane in planes:
            rule = self._rule(plane.index)
            if rule is not None:
                pace = dest.contexts[plane.index].pace if dest.contexts else self.pace
                self.lanes[plane.index] = Lane(self, plane, pace, rule)
        if self.mode == "esr":
            self.next_entropy()

    def _rule(self, index):
        """The mode's `has_packet` for this QP's lane on plane `index` (None: no lane there)."""
        has_packet, mode = self.requester.has_packet, self.mode
        if mode == "static":
            return has_packet if index == self.home else None
        if mode == "software":
            return lambda: self.current == index and has_packet()
        if mode == "esr":
            return lambda: self.esr_plane == index and has_packet()
        usable = self.dest.usable
        return lambda: usable[index] and has_packet()

    def next_entropy(self):
        """ESR: the plane and source port of the next packet (None: no plane is usable)."""
        taken = self.dest.entropy.take(self.dest.usable)
        self.esr_plane, self.esr_sport = taken if taken is not None else (None, None)

    # -- the pacer's sender, through a lane ---------------------------------------------------------

    def next_packet(self, lane, now):
        opcode, psn, ack_req, reth, immediate, request, offset, length = \
            self.requester.next_packet(now, lane.index)
        self.activity.sending(length, now, self.clock_offset)
        if request.data is not None:
            payload = request.data[offset:offset + length]
        else:
            payload = self.zero[:length]
        if immediate is not None:
            payload = immediate.to_bytes(4, "big") + bytes(payload)
        plane = lane.plane
        sport = self.esr_sport if self.esr_sport is not None else self.sports[psn % len(self.sports)]
        return roce.build_ipv4_udp_roce_packet(
            plane.port.address, lane.dst, sport, opcode, self.peer_qpn, psn, payload, reth=reth,
            ack_req=ack_req, dscp=self.dscp, ecn=self.ecn, ip_id=plane.ip_ids.take())

    def sent(self, lane, wire, now):
        plane = lane.plane
        plane.data_packets += 1
        plane.data_bytes += wire
        if self.rp is not None:
            self.rp.on_sent(wire, now)
            self.pace.set_rate(self.rp.rate_mbps)
            self.pace.charge(wire, now)
            if self.rtt_probe is not None:
                self.rtt_probe.on_data(wire)
        elif self.dest.contexts is not None:
            self.dest.contexts[plane.index].sent(wire, now)
        if self.esr_plane is not None:
            self.next_entropy()
            if self.esr_plane is not None and self.esr_plane != plane.index:
                lane = self.lanes[self.esr_plane]
                if not lane.queued and lane.has_packet():
                    lane.plane.pacer.activate(lane, now)

    def refused(self, lane, refusal, now):
        if refusal.kind is send_policy.FATAL:
            detail = send_policy.failure_detail(refusal.error, len(lane.held), lane.dst)
            raise LabError(f"{lane.plane.port.address} towards {self.peer_name}: {detail}")
        if refusal.kind is send_policy.UNREACHABLE and self.multipath:
            # The NIC's own port is down: the packet was lost with it, and goes again on
            # another plane with everything else this QP had there.
            lane.held = None
            self.rnic.port_down(lane.plane, now, "send")

    # -- counters -------------------------------------------------------------------------------

    def send_state(self):
        """What this QP still has to send and why it may not be sending it (None when idle): the
        stall report's view of the sender."""
        r = self.requester
        if r.idle:
            return None
        state = {"peer": self.peer, "queued_messages": len(r.queue),
                 "queued_bytes": sum(req.length for req in r.queue),
                 "unacked_packets": r.outstanding_packets(), "retries": r.retries,
                 "retransmitted_packets": r.counters.retransmitted_packets,
                 "held_lanes": sum(1 for lane in self.lanes if lane is not None and lane.held is not None)}
        if self.rp is not None:
            state["cc"] = self.rnic.cc_kind.name
            state["cc_rate_mbps"] = round(self.rp.rate_mbps, 6)
        return state

    def counters(self):
        r, s = self.requester.counters, self.responder.counters
        out = {"qpn": self.qpn, "peer": self.peer, "peer_qpn": self.peer_qpn,
               "channel": self.channel, "sport": self.sport,
               "plane": None if self.multipath else self.home + 1,
               "tx_packets": r.packets, "tx_bytes": r.bytes,
               "retransmitted_packets": r.retransmitted_packets, "naks_received": r.naks,
               "local_ack_timeout_err": r.local_ack_timeout_err, "messages_completed": r.completed,
               "rx_packets": s.packets, "rx_bytes": s.bytes, "out_of_sequence": s.out_of_sequence,
               "duplicate_request": s.duplicate_request, "packet_seq_err": s.packet_seq_err,
               "acks_sent": s.acks_sent, "ce_marked": self.ce_seen,
               "cnp_sent": self.cnp_sent, "cnp_handled": self.cnp_received,
               "reorder_depth_sum": s.reorder_depth_sum,
               "reorder_depth_max": s.reorder_depth_max, "out_of_window": s.out_of_window,
               "holes_naked": s.holes_naked, "first_send": self.activity.first_send, "last_ack": self.activity.last_ack}
        if self.mode == "software" and self.current != self.home:
            out["moved_to_plane"] = self.current + 1
        if self.rp is not None:
            out[self.rnic.cc_kind.name] = {**self.rp.counters, "rate_mbps": round(self.rp.rate_mbps, 6),
                                           "min_rate_mbps": round(self.min_rate, 6)}
            if self.rtt_probe is not None:
                out[self.rnic.cc_kind.name]["rtt_probes"] = self.rtt_probe.summary()
        return out


TOTAL_KEYS = ("tx_packets", "tx_bytes", "retransmitted_packets", "naks_received",
              "local_ack_timeout_err", "rx_packets", "rx_bytes", "out_of_sequence",
              "duplicate_request", "packet_seq_err", "acks_sent", "ce_marked", "cnp_sent",
              "cnp_handled", "reorder_depth_sum", "out_of_window", "holes_naked")


class UdpRnic:
    """The lab's RNIC on raw sockets, for `rank_driver.RankDriver`."""

    def __init__(self, config, driver):
        self.config = config
        self.driver = driver
        self.transport = config["transport"]
        self.plb = self.transport.get("plb") or {"mode": plb.DEFAULT_MODE}
        self.mode = plb.check_mode(self.plb["mode"])
        self.planes = []
        self.qps = {}
        self.destinations = {}
        self.contexts = []                # every destination's CC contexts, for their timers
        self.events = []                  # plane removals and returns, in order
        self.link_watch = None
        self.by_ifindex = {}
        self.timeline = plb.Timeline(len(config["ports"]))
        self.acked_bytes = 0              # payload acknowledged so far (full packets' worth)
        self.next_timer = 0.0
        self.timer_period = min(TIMER_PERIOD_S, self.transport["ack_timeout_s"] / 5)
        if self.mode != "static":
            self.timer_period = min(self.timer_period, self.plb["probe_interval_s"] / 4)
        if self.transport.get("reorder_timeout_s"):
            self.timer_period = min(self.timer_period, self.transport["reorder_timeout_s"] / 4)
        self.jsq = self.mode in ("per-plane", "global")
        self.scale_up = []                # per plane: the sender towards ranks on this host
        self.cc_idle_s = self.plb.get("cc_idle_s")
        self.control_ip = {"dscp": self.transport["control_dscp"], "ecn": roce.ECN_NOT_ECT}
        self.probe_ip = {"dscp": self.transport["cnp_dscp"], "ecn": roce.ECN_NOT_ECT}
        # SPX's RTT probes measure the data class's queues: its DSCP, never marked
        self.rtt_probe_ip = {"dscp": self.transport["dscp"], "ecn": roce.ECN_NOT_ECT}
        self.cc_kind = cc.kind(self.transport.get("cc_kind", cc.DEFAULT))
        self.rtt_probe_bytes = RTT_PROBE_PACKETS * self.transport["payload_bytes"]

    def open(self):
        transport, config = self.transport, self.config
        frame = (transport["payload_bytes"] + roce.ROCE_OVERHEAD + roce.RETH_LEN
                 + roce.ETH_HEADER_LEN)
        room = self.plb.get("egress_room_bytes") or 0
        for index, port in enumerate(config["ports"]):
            self.planes.append(Plane(index, port, transport.get("nic_queue_bytes"), room,
                                     frame * 8 / (port["rate_mbps"] * 1e6)))
        scale_up = transport.get("scale_up_rate_mbps")
        if scale_up and any(spec.get("local") for spec in config["qps"]):
            # Ranks of one host reach each other through its loopback: paced at the scale-up
            # rate, on their own senders (the NIC's listener hears them, and answers them).
            for index, port in enumerate(config["ports"]):
                self.scale_up.append(Plane(index, {**port, "rate_mbps": scale_up}, None, room,
                                           frame * 8 / (scale_up * 1e6), listen=False))
        if any(plane.intf for plane in self.planes) and self.mode in plb.MULTIPATH:
            self.link_watch = sockets.open_link_watch()
            for plane in self.planes:
                if plane.intf:
                    self.by_ifindex[socket.if_nametoindex(plane.intf)] = plane
        kind = self.cc_kind
        params = kind.from_dict(transport["qp_cc"]) if transport.get("qp_cc") else None
        rp_params = np_params = params
        plane_params = nic_params = None
        if self.mode in plb.MULTIPATH:
            values = self.plb["cc"]
            plane_params = kind.from_dict(values)
            nic_params = kind.from_dict({**values, "line_rate_mbps":
                                         values["line_rate_mbps"] * len(self.planes)})
            rp_params, np_params = None, plane_params
        for spec in config["qps"]:
            peer = spec["peer"]
            dest = self.destinations.get(peer)
            if dest is None:
                dest = self.destinations[peer] = plb.Destination(
                    peer, self.mode, len(self.planes), plane_params, nic_params,
                    self.plb.get("probe_interval_s", 0.05),
                    self.plb.get("probe_timeouts", plb.PROBE_TIMEOUTS),
                    seed=(config.get("data_seed", 1) << 16) ^ (self.driver.rank << 8) ^ peer,
                    probe_every_bytes=self.rtt_probe_bytes)
            qp = QueuePair(spec, self, dest, rp_params, np_params, self.driver.describe(peer))
            dest.qps.append(qp)
            self.qps[qp.qpn] = qp
        self.contexts = [ctx for dest in self.destinations.values() for ctx in dest.unique_contexts()]
        return list(self.qps.values())

    def hello(self):
        return {}

    def selectables(self):
        out = [(plane.port.listener, lambda now, plane=plane: self.receive(plane, now))
               for plane in self.planes]
        if self.link_watch is not None:
            out.append((self.link_watch, self.link_events))
        return out

    def on_control(self, _message):
        return None

    def make_memory(self, regions):
        return Memory(regions)

    def check_schedule(self, _schedule):
        pass

    def close(self):
        for plane in self.planes + self.scale_up:
            plane.close()
        if self.link_watch is not None:
            self.link_watch.close()

    # -- sending ----------------------------------------------------------------------------------

    def post(self, qp, message, data):
        now = time.monotonic()
        if qp.requester.idle:
            qp.progress_at = now
            qp.dest.idle_reset(now, self.cc_idle_s)
        qp.requester.post(WriteRequest(
            message.nbytes, remote_address(message.dst_region, message.dst_offset),
            rkey=REGION_IDS[message.dst_region], immediate=message.tag, data=data,
            context=message.tag))
        self.activate(qp, now)

    def activate(self, qp, now):
        for lane in qp.lanes:
            if lane is not None and not lane.queued and lane.has_packet():
                lane.plane.pacer.activate(lane, now)

    def send_control(self, plane, qp, packet, dst, now, hold_as=None):
        """ACK/NAK/CNP/CTS/probe: sent at once (they are small), counted against the port's
        pace; `hold_as`: kept until a full queue has room (ports.RawPort.transmit_out_of_turn)."""
        refusal = plane.port.transmit_out_of_turn(packet, dst, now, hold_as)
        if refusal is not None:
            detail = send_policy.failure_detail(refusal.error, len(packet), dst)
            raise LabError(f"{plane.port.address} towards {qp.peer_name}: {detail}")

    def poll(self, now):
        """Fire due timers, grant CTS credit, send what is due; when to be called again."""
        if now >= self.next_timer:
            self.timers(now)
            self.next_timer = now + self.timer_period
        if self.driver.cts_enabled:
            self.send_cts(now)
        wake = self.next_timer
        ahead = now + SEND_AHEAD_S
        for plane in self.planes:
            if plane.port.held and not plane.port.send_held(now):
                wake = min(wake, now + send_policy.BUSY_BACKOFF_S)
        for plane in self.scale_up:
            due = plane.pacer.pump(now)
            if due is not None and due < wake:
                wake = due
        for plane in self.planes:
            pacer = plane.pacer
            if (self.jsq and pacer.heap and plane.up and plane.port.pace.due <= ahead
                    and plane.port.queued_bytes() > plane.room_bytes):
                # The port's egress queue is deep (a PFC pause holds it): the other planes
                # take the packets until it drains.
                plane.deep += 1
                due = now + plane.frame_s
            else:
                due = pacer.pump(now)
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
                plane = self.control_plane(qp)
                self.send_control(plane, qp, roce.build_ipv4_udp_roce_packet(
                    plane.port.address, qp.peer_addresses[plane.index], qp.sport,
                    roce.OP_UC_SEND_ONLY, qp.peer_qpn, 0, roce.build_cts_payload(conn.granted_by_me),
                    ip_id=plane.ip_ids.take(), **self.control_ip), qp.peer_addresses[plane.index],
                    now)

    def control_plane(self, qp):
        """The plane a QP's own control packets (CTS) take: its current one, or for a multipath
        QP the first plane usable towards its peer."""
        if not qp.multipath:
            return self.planes[qp.current]
        usable = qp.dest.usable
        return next((p for p in self.planes if usable[p.index]), self.planes[0])

    def timers(self, now):
        software = self.mode == "software"
        for qp in self.qps.values():
            if software:
                self.software_check(qp, now)
            try:
                if qp.requester.check_timeout(now):
                    self.activate(qp, now)
            except TransportError as exc:
                raise PeerError(qp.peer, f"{exc} on QP {qp.qpn:#x}") from None
            if qp.rp is not None:
                qp.rp.advance(now)
            if qp.placing:
                nak = qp.responder.check_hole(now)
                if nak is not None:
                    self.send_ack(self.control_plane(qp), qp, nak, now)
        for ctx in self.contexts:
            ctx.advance(now)
        if self.cc_kind.uses_rtt:
            self.rtt_probes(now)
        if self.mode != "static":
            self.probe(now)
        self.timeline.sample(now, self.acked_bytes,
                             sum(qp.responder.counters.bytes for qp in self.qps.values()),
                             tuple(p.data_bytes for p in self.planes))

    # -- planes: failure, return, probes ------------------------------------------------------------

    def log(self, plane, peer, event, by, now):
        self.events.append({"t": round(now + self.driver.clock_offset, 6), "plane": plane + 1,
                            "peer": peer, "event": event, "by": by})

    def refresh(self, dest):
        for p, plane in enumerate(self.planes):
            dest.usable[p] = plane.up and dest.reachable(p)
        if dest.entropy is not None:
            for qp in dest.qps:
                if qp.esr_plane is None or not dest.usable[qp.esr_plane]:
                    qp.next_entropy()

    def reroute(self, qps, plane, now):
        """Multipath QPs lost `plane`: what they had on it goes again, on the others."""
        for qp in qps:
            if qp.multipath:
                qp.requester.resend_path(plane)
                self.activate(qp, now)

    def port_down(self, plane, now, by):
        """This NIC's own port failed: every destination loses the plane at once."""
        if not plane.up or self.mode not in plb.MULTIPATH:
            return
        plane.up = False
        self.log(plane.index, None, "removed", by, now)
        for dest in self.destinations.values():
            self.refresh(dest)
        self.reroute(self.qps.values(), plane.index, now)

    def port_up(self, plane, now, by):
        if plane.up:
            return
        plane.up = True
        self.log(plane.index, None, "returned", by, now)
        for dest in self.destinations.values():
            self.refresh(dest)
            for qp in dest.qps:
                self.activate(qp, now)

    def link_events(self, now):
        """The NIC's carrier: a port that lost it is down at once (packets sent on it would be
        dropped silently); it comes back when a probe goes out again."""
        for index, up in sockets.read_link_events(self.link_watch):
            plane = self.by_ifindex.get(index)
            if plane is not None and not up:
                self.port_down(plane, now, "carrier")

    def probe(self, now):
        """Probe the planes of every destination with traffic under way (seed 002 4.3, 4.4.1)."""
        software = self.mode == "software"
        for dest in self.destinations.values():
            if all(qp.requester.idle for qp in dest.qps):
                continue
            for p, live in enumerate(dest.liveness):
                plane = self.planes[p]
                if software and not dest.sw_failed[p]:
                    continue             # software probes only the planes it gave up on
                if plane.up and live.expire(now) and not software:
                    self.log(p, dest.peer, "removed", "probes", now)
                    self.refresh(dest)
                    self.reroute(dest.qps, p, now)
                if not plane.up or live.wants_probe(now):
                    self.send_probe(dest, plane, live, now)

    def rtt_probes(self, now):
        """SPX: one RTT probe in flight per context with data in flight (a QP's own, or its
        destination's per plane or global)."""
        for qp in self.qps.values():
            probe = qp.rtt_probe
            if probe is not None and not qp.requester.idle and probe.wants_probe(now):
                self.send_rtt_probe(qp, self.planes[qp.current], probe, RTT_QP, now)
        for dest in self.destinations.values():
            if not dest.contexts or all(qp.requester.idle for qp in dest.qps):
                continue
            if dest.mode == "per-plane":
                for index, ctx in enumerate(dest.contexts):
                    if dest.usable[index] and ctx.probe.wants_probe(now):
                        self.send_rtt_probe(dest.qps[0], self.planes[index], ctx.probe, index, now)
            else:
                ctx = dest.contexts[0]
                usable = [p for p in range(len(self.planes)) if dest.usable[p]]
                if usable and ctx.probe.wants_probe(now):
                    index = usable[ctx.probe.sent % len(usable)]
                    self.send_rtt_probe(dest.qps[0], self.planes[index], ctx.probe, index, now)

    def send_rtt_probe(self, qp, plane, probe, index, now):
        """An RTT probe to `qp`'s peer on `plane`; `index` names the context (a plane, or
        RTT_QP for the QP's own) in the echo."""
        dst = qp.peer_addresses[plane.index]
        packet = roce.build_ipv4_udp_roce_packet(
            plane.port.address, dst, qp.sport, roce.OP_UC_SEND_ONLY, qp.peer_qpn, 0,
            roce.build_rtt_probe_payload(probe.next_seq, index), ip_id=plane.ip_ids.take(),
            **self.rtt_probe_ip)
        if plane.port.transmit(packet, dst) is None:
            plane.port.pace.charge_out_of_turn(len(packet) + roce.ETH_HEADER_LEN, now)
            probe.probe_sent(now)

    def send_probe(self, dest, plane, live, now):
        qp = dest.qps[0]
        dst = qp.peer_addresses[plane.index]
        packet = roce.build_ipv4_udp_roce_packet(
            plane.port.address, dst, qp.sport, roce.OP_UC_SEND_ONLY, qp.peer_qpn, 0,
            roce.build_probe_payload(live.next_seq, plane.index), ip_id=plane.ip_ids.take(),
            **self.probe_ip)
        refusal = plane.port.transmit(packet, dst)
        if refusal is None:
            plane.port.pace.charge_out_of_turn(len(packet) + roce.ETH_HEADER_LEN, now)
            if live.outstanding is None:
                live.probe_sent(now)
            if not plane.up:
                self.port_up(plane, now, "send")
        elif refusal.kind is send_policy.UNREACHABLE:
            self.port_down(plane, now, "send")
        elif refusal.kind is send_policy.FATAL:
            detail = send_policy.failure_detail(refusal.error, len(packet), dst)
            raise LabError(f"{plane.port.address} towards {qp.peer_name}: {detail}")

    def software_check(self, qp, now):
        """NCCL-style: a QP whose messages made no progress for `sw_timeout_s` gives its plane
        up towards that peer; its messages go on on another plane."""
        r = qp.requester
        dest = qp.dest
        if (r.una_seq >= r.next_seq or qp.progress_at is None or dest.sw_failed[qp.current]
                or now - qp.progress_at < self.plb["sw_timeout_s"]):
            return
        lost = qp.current
        dest.sw_failed[lost] = True
        self.log(lost, dest.peer, "removed", "timeout", now)
        healthy = [p for p in range(len(self.planes)) if not dest.sw_failed[p]]
        for i, other in enumerate(q for q in dest.qps if q.current == lost):
            if healthy:
                self.move(other, healthy[i % len(healthy)], now)
        for other in dest.qps:
            other.usable = not dest.sw_failed[other.home]

    def software_return(self, dest, plane, now):
        dest.sw_failed[plane] = False
        self.log(plane, dest.peer, "returned", "echo", now)
        for qp in dest.qps:
            qp.usable = not dest.sw_failed[qp.home]
            if qp.home == plane and qp.current != plane:
                self.move(qp, plane, now)

    def move(self, qp, plane, now):
        """Software: the QP's messages go on on `plane` (the same PSNs, so the responder sees
        each message once), from its oldest unacknowledged packet."""
        old = qp.lanes[qp.current]
        if old is not None:
            old.held = None
        qp.current = plane
        qp.progress_at = now
        qp.requester.rewind(now)
        self.activate(qp, now)

    # -- receiving --------------------------------------------------------------------------------

    def receive(self, plane, now):
        for data, src, tos, sport in plane.port.receive():
            try:
                parsed = roce.parse_roce(data)
            except ValueError:
                continue
            qp = self.qps.get(parsed.bth.dest_qp)
            if qp is None or src not in qp.peer_set:
                continue
            self.handle(qp, parsed, data, tos, plane, sport, now)

    def handle(self, qp, parsed, data, tos, plane, sport, now):
        driver = self.driver
        opcode = parsed.bth.opcode
        if opcode == roce.OP_RC_ACKNOWLEDGE:
            requester = qp.requester
            before = requester.una_seq
            qp.activity.acknowledged(now, driver.clock_offset)
            for request in requester.on_ack(parsed.bth.psn, parsed.aeth, now):
                qp.activity.completed(now)
                driver.message_sent(request.context, now)
            if requester.una_seq != before:
                qp.progress_at = qp.dest.last_active = now
                self.acked_bytes += (requester.una_seq - before) * requester.payload_bytes
            if qp.multipath:
                # The ACK came back on this plane, and the packets it acknowledged got through
                # on theirs: every one of those planes is alive, no probe needed.
                liveness = qp.dest.liveness
                liveness[plane.index].heard(now)
                acked = requester.acked_paths
                if acked:
                    for index in acked:
                        if index is not None:
                            liveness[index].heard(now)
                    acked.clear()
            self.activate(qp, now)
            return
        if opcode == roce.OP_CNP:
            qp.cnp_received += 1
            if qp.rp is not None:
                qp.rp.on_cnp(now)
                qp.min_rate = min(qp.min_rate, qp.rp.rate_mbps)
            elif qp.multipath:
                dest = qp.dest
                dest.contexts[plane.index].on_cnp(now)
                if dest.entropy is not None and dest.entropy.repath(roce.cnp_entropy(data),
                                                                     dest.usable):
                    self.refresh(dest)
            return
        if opcode == roce.OP_UC_SEND_ONLY:
            self.control_message(qp, data, plane, now)
            return
        if (tos & 3) == roce.ECN_CE:
            qp.ce_seen += 1
            qp.responder.counters.ce += 1
            if qp.nps is not None and qp.nps[plane.index].on_ce(now):
                qp.cnp_sent += 1
                peer = qp.peer_addresses[plane.index]
                self.send_control(plane, qp, roce.build_cnp_packet(
                    plane.port.address, peer, qp.sport, qp.peer_qpn, entropy=sport,
                    dscp=self.transport["cnp_dscp"], ecn=roce.ECN_NOT_ECT,
                    ip_id=plane.ip_ids.take()), peer, now)
        action = qp.responder.on_packet(parsed, now)
        if action.placement is not None and driver.memory is not None:
            place = action.placement
            region, offset = split_address(place.vaddr)
            start = place.offset_in_payload
            driver.memory.write(region, offset, data[start:start + place.length])
        if action.reply is not None:
            self.send_ack(plane, qp, action.reply, now)
        if action.completion is not None:
            done = action.completion
            driver.message_received(qp, done.immediate, done.length, now)
        if action.completions:
            for done in action.completions:
                driver.message_received(qp, done.immediate, done.length, now)

    def send_ack(self, plane, qp, reply, now):
        """An ACK or NAK, (psn, syndrome), to the QP's peer on `plane`."""
        psn, syndrome = reply
        peer = qp.peer_addresses[plane.index]
        # Held, not lost, while a PFC pause fills the port's queue: a lost ACK costs its QP a
        # whole ACK timeout on a fabric that dropped nothing. The latest per QP stands for all.
        self.send_control(plane, qp, roce.build_ack_packet(
            plane.port.address, peer, qp.sport, qp.peer_qpn, psn, syndrome,
            qp.responder.msn, ip_id=plane.ip_ids.take(), **self.control_ip), peer, now,
            hold_as=("ack", qp.qpn))

    def control_message(self, qp, data, plane, now):
        """A UC SEND: a CTS grant, a plane probe (echo it on the plane it came by) or an echo."""
        granted = roce.parse_cts_payload(data)
        if granted is not None:
            driver = self.driver
            driver.grant(driver.connections[(qp.peer, qp.channel)], granted)
            return
        probe = roce.parse_probe_payload(data)
        if probe is None:
            self.rtt_message(qp, data, plane, now)
            return
        is_echo, seq, index = probe
        if not is_echo:
            self.echo(plane, qp, roce.build_probe_payload(seq, index, echo=True), self.probe_ip, now)
            return
        dest = self.destinations.get(qp.peer)
        if dest is None or index >= len(self.planes):
            return
        live = dest.liveness[index]
        was_removed = live.removed
        if not live.on_echo(seq, now):
            return
        if self.mode == "software":
            if dest.sw_failed[index]:
                self.software_return(dest, index, now)
        elif was_removed:
            self.log(index, dest.peer, "returned", "echo", now)
            self.refresh(dest)
            for other in dest.qps:
                self.activate(other, now)

    def echo(self, plane, qp, payload, ip, now):
        """Answer a probe at once, as a UC SEND on the plane it came by, with the IP fields `ip`."""
        peer = qp.peer_addresses[plane.index]
        self.send_control(plane, qp, roce.build_ipv4_udp_roce_packet(
            plane.port.address, peer, qp.sport, roce.OP_UC_SEND_ONLY, qp.peer_qpn, 0, payload,
            ip_id=plane.ip_ids.take(), **ip), peer, now)

    def rtt_message(self, qp, data, plane, now):
        """SPX: an RTT probe (echo it at once, in the control class, on the plane it came by)
        or an echo (its sample goes to the context it names)."""
        probe = roce.parse_rtt_probe_payload(data)
        if probe is None:
            return
        is_echo, seq, index = probe
        if not is_echo:
            self.echo(plane, qp, roce.build_rtt_probe_payload(seq, index, echo=True), self.control_ip, now)
            return
        if index == RTT_QP:
            if qp.rtt_probe is not None:
                rtt = qp.rtt_probe.on_echo(seq, now)
                if rtt is not None:
                    qp.rp.on_rtt(rtt, now)
                    qp.pace.set_rate(qp.rp.rate_mbps)
                    qp.min_rate = min(qp.min_rate, qp.rp.rate_mbps)
                    self.activate(qp, now)
            return
        dest = qp.dest
        if dest.contexts and index < len(dest.contexts) and dest.contexts[index].on_echo(seq, now):
            for other in dest.qps:
                self.activate(other, now)

    # -- counters ---------------------------------------------------------------------------------

    def totals(self):
        total = dict.fromkeys(TOTAL_KEYS, 0)
        for qp in self.qps.values():
            c = qp.counters()
            for key in TOTAL_KEYS:
                total[key] += c[key]
        total["enobufs"] = sum(p.port.enobufs for p in self.planes)
        total["acks_held"] = sum(p.port.held_packets for p in self.planes)
        total["send_errors"] = sum(p.port.send_errors for p in self.planes)
        return total

    def plane_bytes(self):
        """Data bytes (wire) sent on each plane so far."""
        return [plane.data_bytes for plane in self.planes]

    def qp_counters(self):
        return [qp.counters() for qp in self.qps.values()]

    def port_reports(self):
        return [plane.port.report() for plane in self.planes]

    def plb_report(self):
        """The plane load balancer's record for the final message: per plane what went, per
        destination its contexts and probes, the removals and returns, the timeline."""
        qps = list(self.qps.values())
        oos = sum(qp.responder.counters.out_of_sequence for qp in qps)
        depth = sum(qp.responder.counters.reorder_depth_sum for qp in qps)
        return {"mode": self.mode,
                "planes": [plane.report() for plane in self.planes],
                "destinations": ([dest.summary() for _peer, dest in sorted(self.destinations.items())]
                                 if self.mode != "static" else []),
                "events": self.events,
                "reorder": {"out_of_sequence": oos,
                            "depth_max": max((qp.responder.counters.reorder_depth_max for qp in qps),
                                             default=0),
                            "depth_mean": round(depth / oos, 3) if oos else None},
                "timeline": self.timeline.record(self.driver.clock_offset)}

    def status(self):
        """Each busy QP's send state (at most 8), and the ports holding ACKs or CNPs back (their queue full: paused)."""
        sending = [state for state in (qp.send_state() for qp in self.qps.values()) if state]
        return {"sending": sending[:8],
                "held_ports": [plane.index + 1 for plane in self.planes if plane.port.held]}


def main(argv=None):
    return rank_driver.main(argv, UdpRnic, module="fabriclab.traffic.agent",
                            prog="fabriclab-agent")


if __name__ == "__main__":
    sys.exit(main())
