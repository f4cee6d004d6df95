"""The RC transport of one queue pair, as an RDMA NIC runs it: PSNs, ACKs, go-back-N, timeouts.

Pure state machines with no sockets and no clock of their own (every call takes `now`), so the
behaviour is unit-tested on crafted packet sequences and the agent only moves bytes.

Requester (the side that posts RDMA WRITEs):
- every packet gets the next 24-bit PSN; a message's last packet, and every `ack_every`-th
  packet, asks for an ACK (the BTH A bit), so the responder can coalesce ACKs;
- an ACK for PSN p acknowledges every packet up to p; a message completes (a CQE) when its last
  packet is acknowledged;
- a NAK (PSN sequence error) for p acknowledges everything before p and rewinds the send cursor
  to p: go-back-N, the recovery RoCE NICs use;
- if nothing is acknowledged for `timeout_s` while packets are outstanding, the requester
  rewinds to the oldest unacknowledged packet (a local ACK timeout) and, after `retry_limit`
  timeouts in a row without progress, fails the QP ("transport retry counter exceeded").

Responder (the side whose memory is written):
- accepts only the expected PSN; a packet ahead of it (loss or reordering) is out of sequence:
  dropped, answered with one NAK per gap; a packet behind it is a duplicate: dropped and
  re-acknowledged if it asks for an ACK;
- in-order packets are placed at the RETH address plus their offset in the message; a WRITE
  with immediate data completes a message towards the application (the collective).

Multipath (a QP whose packets take several planes, seed 002 sections 3 and 4.3): the requester
makes every packet self-describing (an RDMA WRITE ONLY carrying its own RETH, the last of a
message WITH IMMEDIATE, as IRN and other multipath transports do), keeps at most `window`
packets outstanding, remembers the path (plane) each packet last took and can resend exactly
the unacknowledged packets of one path (`resend_path`: the plane failed). The
`PlacingResponder` places every packet within its window on arrival, whatever its order,
remembers which arrived (the bitmap), acknowledges cumulatively, and completes messages in PSN
order; it never NAKs reordering, so a real loss is recovered by the requester (a path's resend,
or the local ACK timeout's go-back-N, whose duplicates the bitmap drops). A hole that stays
open longer than any reordering a path can cause (`reorder_timeout_s`: every buffer of a path
draining) is a loss: the responder NAKs its PSN and the requester resends that one packet
(selective repeat, as IRN does), long before its ACK timeout.

Counter names follow the RNIC counters operators read (mlx5 names): out_of_sequence,
duplicate_request, packet_seq_err (NAKs sent), local_ack_timeout_err, ...
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from fabriclab.traffic import roce

PSN_WINDOW = roce.PSN_MODULUS >> 1


class TransportError(Exception):
    """A QP failed: the retry counter ran out (the peer is unreachable or dead)."""


@dataclass
class WriteRequest:
    """One RDMA WRITE posted to a QP, or with `send` a SEND (it lands in the buffer of the
    responder's next receive request; vaddr and rkey are unused): a work request. `immediate`
    None sends the message without immediate data (the collective's writes always carry it)."""

    length: int
    vaddr: int
    rkey: int
    immediate: int | None
    data: object = None          # bytes-like of `length` bytes, or None to send zeros
    context: object = None       # the poster's handle, returned on completion
    first_seq: int = -1          # sequence number of the first packet, once started
    npackets: int = 0
    send: bool = False


@dataclass
class RequesterCounters:
    packets: int = 0
    bytes: int = 0               # RDMA payload bytes, retransmissions included
    retransmitted_packets: int = 0
    acks: int = 0
    naks: int = 0                # NAKs received (each triggers a go-back-N)
    rnr_naks: int = 0            # receiver-not-ready NAKs received (each a wait, then a resend)
    local_ack_timeout_err: int = 0
    completed: int = 0           # messages completed (CQEs)


class Requester:
    """The sending half of a QP. Sequence numbers are unbounded ints; PSN = seq mod 2**24."""

    def __init__(self, initial_psn, payload_bytes, *, ack_every=16, timeout_s=0.5, retry_limit=7,
                 self_describing=False, window=None, rnr_retry=7):
        if payload_bytes <= 0 or payload_bytes % 4:
            raise ValueError(f"payload_bytes must be a positive multiple of 4, got {payload_bytes}")
        self.payload_bytes = payload_bytes
        self.ack_every = ack_every
        self.timeout_s = timeout_s
        self.retry_limit = retry_limit
        self.self_describing = self_describing
        # Multipath: no new message starts while `window` packets are outstanding (the
        # responder's bitmap must hold every packet in flight), and each packet's path is kept.
        self.window = window
        self._paths = deque() if self_describing else None   # path of seq una_seq + i
        # The paths of packets acknowledged since the caller last emptied it: those paths work.
        self.acked_paths = set()
        self._resend = deque()     # sequence numbers to send again first, ascending
        self.base_psn = initial_psn & roce.PSN_MASK
        self.next_seq = 0          # the next new packet
        self.send_seq = 0          # the next packet to transmit (< next_seq after a rewind)
        self.una_seq = 0           # the oldest unacknowledged packet
        self.high_seq = 0          # one past the highest packet ever transmitted
        self.queue = deque()       # posted, not started
        self.inflight = deque()    # started, not completed, in sequence order
        self.retries = 0
        self.last_progress = None
        # Receiver not ready (a SEND found no receive posted): nothing goes before `rnr_until`;
        # `rnr_retry` such NAKs in a row fail the QP, except 7, which retries for ever (IBTA).
        self.rnr_retry = rnr_retry
        self.rnr_retries = 0
        self.rnr_until = None
        self.counters = RequesterCounters()
        self._cursor = None        # (index in inflight, packet index) for send_seq < next_seq

    # -- posting and sending ----------------------------------------------------------------------

    def post(self, request):
        if request.length <= 0:
            raise ValueError("an RDMA WRITE or SEND carries at least one byte")
        if request.send and self.self_describing:
            raise ValueError("a self-describing (multipath) requester sends RDMA WRITEs only: "
                             "a SEND's packets carry no address to place them by")
        self.queue.append(request)

    @property
    def idle(self):
        """Nothing posted and nothing awaiting an ACK."""
        return not self.queue and not self.inflight

    def has_packet(self):
        if self.send_seq < self.next_seq or self._resend:
            return True
        return bool(self.queue) and (self.window is None
                                     or self.next_seq - self.una_seq < self.window)

    def outstanding_packets(self):
        return self.next_seq - self.una_seq

    def psn(self, seq):
        return (self.base_psn + seq) & roce.PSN_MASK

    def next_packet(self, now, path=None):
        """The next packet to transmit: (opcode, psn, ack_req, reth, immediate, request, offset,
        length). Assumes has_packet(). `path`: where it goes (multipath: kept per packet)."""
        resend = self._resend
        if resend:
            seq = resend.popleft()
            request, index = self._locate(seq)
        else:
            if self.send_seq < self.next_seq:
                request, index = self._locate(self.send_seq)
            else:
                request = self.queue.popleft()
                request.first_seq = self.next_seq
                request.npackets = max(1, -(-request.length // self.payload_bytes))
                self.inflight.append(request)
                self.next_seq += request.npackets
                index = 0
            seq = self.send_seq
            self.send_seq += 1
        retransmission = seq < self.high_seq
        if retransmission:
            self.counters.retransmitted_packets += 1
        else:
            self.high_seq = seq + 1
        if self.last_progress is None:       # the first packet outstanding starts the ACK timer
            self.last_progress = now
        paths = self._paths
        if paths is not None:
            slot = seq - self.una_seq
            if slot < len(paths):
                paths[slot] = path
            else:
                paths.append(path)
        last = index == request.npackets - 1
        offset = index * self.payload_bytes
        length = min(self.payload_bytes, request.length - offset)
        if self.self_describing:
            opcode = (roce.OP_RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE if last
                      else roce.OP_RC_RDMA_WRITE_ONLY)
            reth = (request.vaddr + offset, request.rkey, length)
        elif request.send:
            opcode = roce.send_opcode(index, request.npackets, request.immediate is not None)
            reth = None
        else:
            opcode = roce.write_opcode(index, request.npackets, request.immediate is not None)
            reth = (request.vaddr, request.rkey, request.length) if index == 0 else None
        immediate = request.immediate if last else None
        # A packet sent again asks for an ACK: if it arrives as a duplicate, or fills the hole
        # before a run of packets none of which asked, the requester still hears of it (a QP its
        # rate limit lets send one packet per timeout would otherwise never see progress).
        ack_req = last or retransmission or (seq + 1) % self.ack_every == 0
        self.counters.packets += 1
        self.counters.bytes += length
        return opcode, self.psn(seq), ack_req, reth, immediate, request, offset, length

    def resend_path(self, path):
        """Send again, before anything else, every unacknowledged packet whose last transmission
        took `path` (a plane that failed: what was on it is lost). Returns how many."""
        if self._paths is None:
            raise ValueError("resend_path needs a self-describing (multipath) requester")
        una, sent = self.una_seq, min(self.high_seq, self.send_seq) - self.una_seq
        lost = {una + i for i, p in enumerate(self._paths) if i < sent and p == path}
        lost.difference_update(self._resend)
        if lost:
            self._resend = deque(sorted(lost.union(self._resend)))
        return len(lost)

    def _locate(self, seq):
        last = self.inflight[-1]
        if last.first_seq <= seq:            # the message being sent: the common case
            return last, seq - last.first_seq
        for request in self.inflight:
            if request.first_seq <= seq < request.first_seq + request.npackets:
                return request, seq - request.first_seq
        raise AssertionError(f"sequence {seq} is not in flight")

    # -- acknowledgements and timers ----------------------------------------------------------------

    def _seq_of(self, psn):
        """The sequence number of an acknowledged PSN, or None if it is not outstanding."""
        delta = (psn - self.psn(self.una_seq)) & roce.PSN_MASK
        if delta >= PSN_WINDOW:
            return None
        seq = self.una_seq + delta
        return seq if seq <= self.next_seq else None

    def ready(self, now):
        """False while an RNR NAK's wait lasts: send nothing before `rnr_until`. (The collective's
        agents never see one: their peers post no receives and take only RDMA WRITEs.)"""
        return self.rnr_until is None or now >= self.rnr_until

    def on_ack(self, psn, aeth, now):
        """Process an ACK or NAK; returns the requests completed by it (in order)."""
        if aeth.is_rnr:
            # Receiver not ready: everything before `psn` arrived; the packet at `psn` goes
            # again after the timer the NAK names (IBTA 9.7.5.2.8). It is no loss: no go-back-N
            # counted, the ACK timer waits with it.
            self.counters.rnr_naks += 1
            seq = self._seq_of(psn)
            if seq is None or seq >= self.next_seq:
                return []
            self.rnr_retries += 1
            if self.rnr_retry != 7 and self.rnr_retries > self.rnr_retry:
                raise TransportError(f"RNR retry counter exceeded at PSN {psn} after "
                                     f"{self.rnr_retry} receiver-not-ready NAKs")
            completed = self._acknowledge(seq, now)
            self.send_seq = seq
            self._resend.clear()
            self.rnr_until = now + roce.rnr_timer_s(aeth.syndrome & 0x1F)
            self.last_progress = None
            return completed
        if aeth.is_nak:
            self.counters.naks += 1
            if aeth.syndrome != roce.AETH_NAK_PSN_SEQUENCE_ERROR:
                raise TransportError(f"remote NAK with syndrome {aeth.syndrome:#04x}")
            seq = self._seq_of(psn)
            if seq is None or seq > self.next_seq:
                return []
            completed = self._acknowledge(seq, now)   # everything before the NAK'd PSN
            if self.self_describing:
                # A placing responder NAKs a hole it gave up waiting for: that packet only.
                if seq < min(self.high_seq, self.send_seq) and seq not in self._resend:
                    self._resend.appendleft(seq)        # every other queued resend is later
            else:
                self.send_seq = seq                     # go back to it
            return completed
        self.counters.acks += 1
        seq = self._seq_of(psn)
        if seq is None or seq >= self.next_seq:
            return []                                   # stale or bogus ACK
        return self._acknowledge(seq + 1, now)

    def _acknowledge(self, upto_seq, now):
        """Everything before `upto_seq` is acknowledged."""
        if upto_seq <= self.una_seq:
            return []
        paths = self._paths
        if paths is not None:
            acked = self.acked_paths
            for _ in range(min(upto_seq - self.una_seq, len(paths))):
                acked.add(paths.popleft())
        resend = self._resend
        while resend and resend[0] < upto_seq:
            resend.popleft()
        self.una_seq = upto_seq
        self.send_seq = max(self.send_seq, upto_seq)
        self.retries = 0
        self.rnr_until = None
        self.last_progress = now if self.una_seq < self.next_seq else None
        done = []
        while self.inflight and self.inflight[0].first_seq + self.inflight[0].npackets <= upto_seq:
            done.append(self.inflight.popleft())
        self.counters.completed += len(done)
        return done

    def deadline(self):
        """When the local ACK timer fires, or None when nothing is outstanding."""
        if self.una_seq >= self.next_seq or self.last_progress is None:
            return None
        return self.last_progress + self.timeout_s

    def check_timeout(self, now):
        """Fire the local ACK timer if due: rewind to the oldest unacknowledged packet.

        Raises TransportError once `retry_limit` retries went by without progress.
        """
        deadline = self.deadline()
        if deadline is None or now < deadline:
            return False
        self.counters.local_ack_timeout_err += 1
        self.retries += 1
        if self.retries > self.retry_limit:
            raise TransportError(f"transport retry counter exceeded: no ACK for PSN "
                                 f"{self.psn(self.una_seq)} after {self.retry_limit} retries of "
                                 f"{self.timeout_s:g} s")
        self.send_seq = self.una_seq
        self._resend.clear()
        # The timer starts again when the retransmission leaves (`next_packet`), as an RNIC's
        # does: a QP its rate limit holds back (DCQCN cut it to a trickle, and at the lab's time
        # scale its recovery timer is seconds) spends no retries without sending.
        self.last_progress = None
        return True

    def rewind(self, now):
        """Go back to the oldest unacknowledged packet now (the QP moved to another path: what
        was in flight on the old one may be lost). Not a timeout: no retry is counted."""
        self.send_seq = self.una_seq
        self._resend.clear()
        if self.una_seq < self.next_seq:
            self.last_progress = now


@dataclass
class ResponderCounters:
    packets: int = 0             # accepted in sequence
    bytes: int = 0
    out_of_sequence: int = 0     # ahead of the expected PSN: dropped (go-back-N)
    duplicate_request: int = 0   # behind the expected PSN: dropped, re-acknowledged
    packet_seq_err: int = 0      # NAKs sent
    acks_sent: int = 0
    completed: int = 0           # WRITE-with-immediate messages completed
    ce: int = 0                  # packets that arrived ECN CE-marked
    reorder_depth_max: int = 0   # placing responder: the farthest ahead of the expected PSN
    reorder_depth_sum: int = 0   # ... summed over the out-of-sequence arrivals (for the mean)
    out_of_window: int = 0       # placing responder: beyond the bitmap, dropped
    holes_naked: int = 0         # placing responder: holes given up as lost (also packet_seq_err)
    rnr_naks_sent: int = 0       # SENDs that found no receive posted
    invalid_request: int = 0     # packets refused with an invalid-request NAK


@dataclass
class ReceiveRequest:
    """A receive work request: the next SEND to the QP lands at `vaddr` (the poster's address
    space), `length` bytes at most."""

    vaddr: int
    length: int
    context: object = None


@dataclass
class Placement:
    """An accepted packet's bytes go to `rkey` at `vaddr` (already offset within the message);
    a SEND's have no rkey: `vaddr` is in its receive request's buffer."""

    rkey: int
    vaddr: int
    offset_in_payload: int
    length: int


@dataclass
class Completion:
    """A message the responder finished: its immediate data (None: none) and where it was
    written. A SEND's (`send`) names its receive request's context."""

    immediate: int | None
    rkey: int | None
    vaddr: int
    length: int
    send: bool = False
    context: object = None


@dataclass
class ResponderAction:
    placement: Placement | None = None
    completion: Completion | None = None
    reply: tuple | None = None           # (psn, syndrome) to send as ACK/NAK
    completions: list | None = None      # placing responder: messages completed, in order


class Responder:
    """The receiving half of a QP: in-order acceptance, NAK once per gap, ACK on request.

    RDMA WRITEs land where their RETH says. A SEND takes the oldest posted receive request
    (`post_receive`) and lands in its buffer; with none posted it is answered with an RNR NAK
    (receiver not ready, timer code `rnr_timer`) and not accepted, so the requester sends it again
    later. A message whose packets break the FIRST, MIDDLE..., LAST order, or that overruns its
    RETH length or receive buffer, is refused with an invalid-request NAK."""

    def __init__(self, initial_psn, rnr_timer=14):
        self.expected = initial_psn & roce.PSN_MASK
        self.nak_outstanding = False
        self.msn = 0
        self.rnr_timer = rnr_timer       # 14: 1.28 ms
        self.receives = deque()
        self.counters = ResponderCounters()
        # (rkey, vaddr, length, bytes placed, receive request or None) of the message underway
        self._message = None

    def post_receive(self, request):
        """Queue a ReceiveRequest for a SEND to come."""
        if request.length < 0:
            raise ValueError(f"a receive buffer has a length >= 0, got {request.length}")
        self.receives.append(request)

    def on_packet(self, parsed, now=0.0):
        """Process one RDMA WRITE or SEND packet (a `roce.ParsedRoce`); returns a ResponderAction.
        (`now` is for the placing responder's holes; an in-order receiver NAKs at once.)"""
        bth = parsed.bth
        action = ResponderAction()
        if bth.psn != self.expected:
            if roce.psn_behind(bth.psn, self.expected):
                self.counters.duplicate_request += 1
                if bth.ack_req:
                    action.reply = (roce.psn_add(self.expected, -1), roce.AETH_ACK)
                    self.counters.acks_sent += 1
            else:
                self.counters.out_of_sequence += 1
                if not self.nak_outstanding:
                    self.nak_outstanding = True
                    self.counters.packet_seq_err += 1
                    action.reply = (self.expected, roce.AETH_NAK_PSN_SEQUENCE_ERROR)
            return action
        opcode = bth.opcode
        send = opcode in roce.SEND_OPCODES
        message = self._message
        if opcode in roce.FIRST_OPCODES:
            if message is not None:
                return self._invalid(action, bth)        # the last message never ended
            if send:
                if not self.receives:
                    self.counters.rnr_naks_sent += 1
                    action.reply = (bth.psn, roce.AETH_RNR_NAK | self.rnr_timer)
                    return action                        # not accepted: it comes again
                receive = self.receives.popleft()
                message = [None, receive.vaddr, receive.length, 0, receive]
            else:
                reth = parsed.reth
                message = [reth.rkey, reth.vaddr, reth.dma_len, 0, None]
        elif message is None or (message[4] is not None) != send:
            return self._invalid(action, bth)            # a MIDDLE or LAST of no such message
        rkey, vaddr, total, placed, receive = message
        length = parsed.payload_len
        last = opcode in roce.LAST_OPCODES
        if placed + length > total or (last and not send and placed + length != total):
            return self._invalid(action, bth)            # beyond the buffer, or short of the RETH
        self.nak_outstanding = False
        self.expected = roce.psn_add(self.expected)
        self._message = message
        action.placement = Placement(rkey, vaddr + placed, parsed.payload_offset, length)
        message[3] = placed + length
        self.counters.packets += 1
        self.counters.bytes += length
        if last:
            self.msn = (self.msn + 1) & 0xFFFFFF
            if send:
                action.completion = Completion(parsed.immediate, None, vaddr, message[3], True,
                                               receive.context)
                self.counters.completed += 1
            elif parsed.immediate is not None:
                action.completion = Completion(parsed.immediate, rkey, vaddr, message[3])
                self.counters.completed += 1
            self._message = None
        if bth.ack_req:
            action.reply = (bth.psn, roce.AETH_ACK)
            self.counters.acks_sent += 1
        return action

    def _invalid(self, action, bth):
        """Refuse the expected packet: an invalid-request NAK; the message underway is dropped."""
        self.counters.invalid_request += 1
        self._message = None
        action.reply = (bth.psn, roce.AETH_NAK_INVALID_REQUEST)
        return action


class PlacingResponder:
    """The receiving half of a multipath QP: direct placement of every packet within `window`
    PSNs of the expected one, a bitmap of what arrived ahead, cumulative ACKs, completions in
    PSN order. Every packet carries its own RETH (the requester's `self_describing` mode).

    Nothing is buffered but the bookkeeping of each packet that arrived ahead: its length, its
    immediate data and whether it asked for an ACK. When the expected packet arrives, the run of
    packets behind it that already arrived is consumed too; the ACK then names the new
    cumulative PSN if any consumed packet asked for one, so a requester waiting for the ACK of a
    message's last packet hears it even when that packet came before a hole was filled.
    Reordering is not NAKed at once (a late plane is not a loss): only a hole older than
    `hole_timeout_s` (None: never) is, by `check_hole`. Packets behind the expected PSN, or ahead
    of it and already arrived, are duplicates."""

    def __init__(self, initial_psn, window, hole_timeout_s=None):
        if not 1 <= window < PSN_WINDOW:
            raise ValueError(f"window must be 1..{PSN_WINDOW - 1} packets, got {window}")
        if hole_timeout_s is not None and not hole_timeout_s > 0:
            raise ValueError(f"hole timeout must be > 0 s, got {hole_timeout_s!r}")
        self.expected = initial_psn & roce.PSN_MASK
        self.window = window
        self.hole_timeout_s = hole_timeout_s
        self.msn = 0
        self.counters = ResponderCounters()
        self._ahead = {}             # psn -> (length, immediate, ack_req, rkey, vaddr, arrived)
        self._message_bytes = 0      # consumed bytes of the message under way
        self.hole_since = None       # the first arrival beyond the open hole at `expected`
        self.naked_at = None         # when that hole was last NAKed

    def check_hole(self, now):
        """The NAK (psn, syndrome) to send for a hole open longer than the timeout (again after
        another timeout if it stays open), else None."""
        timeout = self.hole_timeout_s
        if self.hole_since is None or timeout is None or now - self.hole_since < timeout:
            return None
        if self.naked_at is not None and now - self.naked_at < timeout:
            return None
        self.naked_at = now
        self.counters.holes_naked += 1
        self.counters.packet_seq_err += 1
        return self.expected, roce.AETH_NAK_PSN_SEQUENCE_ERROR

    def on_packet(self, parsed, now=0.0):
        bth = parsed.bth
        psn = bth.psn
        counters = self.counters
        action = ResponderAction()
        distance = (psn - self.expected) & roce.PSN_MASK
        if distance >= PSN_WINDOW or (distance and psn in self._ahead):
            counters.duplicate_request += 1
            if bth.ack_req:
                action.reply = (roce.psn_add(self.expected, -1), roce.AETH_ACK)
                counters.acks_sent += 1
            return action
        if distance >= self.window:
            counters.out_of_window += 1
            return action
        reth = parsed.reth
        if reth is None:             # not a self-describing packet: nowhere to place it
            counters.out_of_sequence += 1
            return action
        length = parsed.payload_len
        action.placement = Placement(reth.rkey, reth.vaddr, parsed.payload_offset, length)
        counters.packets += 1
        counters.bytes += length
        if distance:
            counters.out_of_sequence += 1
            counters.reorder_depth_sum += distance
            if distance > counters.reorder_depth_max:
                counters.reorder_depth_max = distance
            self._ahead[psn] = (length, parsed.immediate, bth.ack_req, reth.rkey, reth.vaddr, now)
            if self.hole_since is None:
                self.hole_since = now
            return action
        ack = self._consume(length, parsed.immediate, bth.ack_req, reth.rkey, reth.vaddr, action)
        ahead = self._ahead
        while ahead and self.expected in ahead:
            ack |= self._consume(*ahead.pop(self.expected)[:5], action)
        if self.hole_since is not None:
            # The hole is filled. Another may open right behind it (a burst lost together): its
            # age is that of the oldest arrival still waiting beyond it.
            self.hole_since = min((entry[5] for entry in ahead.values()), default=None)
            self.naked_at = None
        if ack:
            action.reply = (roce.psn_add(self.expected, -1), roce.AETH_ACK)
            counters.acks_sent += 1
        return action

    def _consume(self, length, immediate, ack_req, rkey, vaddr, action):
        """The expected packet is in: move the cumulative PSN past it; complete its message."""
        self.expected = roce.psn_add(self.expected)
        self.msn = (self.msn + 1) & 0xFFFFFF        # every self-describing packet is a message
        self._message_bytes += length
        if immediate is not None:
            total = self._message_bytes
            self._message_bytes = 0
            self.counters.completed += 1
            done = Completion(immediate, rkey, vaddr + length - total, total)
            if action.completions is None:
                action.completions = [done]
            else:
                action.completions.append(done)
        return ack_req
