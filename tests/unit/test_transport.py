"""The RC transport state machines on crafted packet sequences (no network)."""

import pytest
from scapy.contrib.roce import AETH, BTH, CNPPadding
from scapy.layers.inet import IP, UDP

from fabriclab.traffic import roce
from fabriclab.traffic.transport import (PlacingResponder, Requester, Responder, TransportError,
                                         WriteRequest)

PAYLOAD = 1024


def write(length, tag=7, vaddr=0x1000):
    return WriteRequest(length, vaddr, rkey=2, immediate=tag, context=tag)


def drain(req, now=0.0):
    """Every packet the requester has to send now, as dicts."""
    out = []
    while req.has_packet():
        opcode, psn, ack_req, reth, imm, request, offset, length = req.next_packet(now)
        out.append(dict(opcode=opcode, psn=psn, ack_req=ack_req, reth=reth, imm=imm,
                        offset=offset, length=length))
    return out


def as_parsed(pkt, initial_payload=b""):
    """A requester packet dict -> the bytes on the wire -> roce.parse_roce, as a responder sees it."""
    payload = b"\x00" * pkt["length"]
    if pkt["imm"] is not None:
        payload = pkt["imm"].to_bytes(4, "big") + payload
    datagram = roce.build_ipv4_udp_roce_packet("10.0.0.1", "10.0.0.2", 0xC001, pkt["opcode"], 0x11,
                                               pkt["psn"], payload, reth=pkt["reth"],
                                               ack_req=pkt["ack_req"])
    udp_payload = datagram[roce.IPV4_HEADER_LEN + roce.UDP_HEADER_LEN:]
    return roce.parse_roce(udp_payload), udp_payload


ACK = roce.Aeth(roce.AETH_ACK, 0)
NAK = roce.Aeth(roce.AETH_NAK_PSN_SEQUENCE_ERROR, 0)


def test_message_segmentation_opcodes_and_ack_requests():
    req = Requester(100, PAYLOAD, ack_every=2)
    req.post(write(3 * PAYLOAD + 8))
    pkts = drain(req)
    assert [p["opcode"] for p in pkts] == [roce.OP_RC_RDMA_WRITE_FIRST, roce.OP_RC_RDMA_WRITE_MIDDLE,
                                           roce.OP_RC_RDMA_WRITE_MIDDLE,
                                           roce.OP_RC_RDMA_WRITE_LAST_WITH_IMMEDIATE]
    assert [p["psn"] for p in pkts] == [100, 101, 102, 103]
    assert [p["length"] for p in pkts] == [PAYLOAD] * 3 + [8]
    assert pkts[0]["reth"] == (0x1000, 2, 3 * PAYLOAD + 8) and pkts[1]["reth"] is None
    assert pkts[-1]["imm"] == 7 and all(p["imm"] is None for p in pkts[:-1])
    # every 2nd packet and the last one ask for an ACK
    assert [p["ack_req"] for p in pkts] == [False, True, False, True]


def test_small_message_is_write_only_with_immediate():
    req = Requester(0, PAYLOAD)
    req.post(write(40))
    (pkt,) = drain(req)
    assert pkt["opcode"] == roce.OP_RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE and pkt["ack_req"]
    parsed, _ = as_parsed(pkt)
    assert parsed.reth.dma_len == 40 and parsed.immediate == 7 and parsed.payload_len == 40


def test_psn_wraps_at_24_bits():
    req = Requester(roce.PSN_MASK - 1, PAYLOAD)
    req.post(write(3 * PAYLOAD))
    pkts = drain(req)
    assert [p["psn"] for p in pkts] == [roce.PSN_MASK - 1, roce.PSN_MASK, 0]
    done = req.on_ack(0, ACK, 1.0)
    assert [r.immediate for r in done] == [7] and req.idle


def test_cumulative_ack_completes_messages_in_order():
    req = Requester(10, PAYLOAD)
    for tag in (1, 2, 3):
        req.post(write(2 * PAYLOAD, tag=tag))
    drain(req)
    assert [r.context for r in req.on_ack(13, ACK, 1.0)] == [1, 2]     # PSNs 10..13
    assert req.outstanding_packets() == 2
    assert req.on_ack(12, ACK, 1.1) == []                               # stale
    assert [r.context for r in req.on_ack(15, ACK, 1.2)] == [3]
    assert req.idle and req.counters.completed == 3


def test_nak_goes_back_to_the_missing_packet():
    req = Requester(0, PAYLOAD)
    req.post(write(4 * PAYLOAD, tag=1))
    req.post(write(PAYLOAD, tag=2))
    drain(req)
    assert req.on_ack(2, NAK, 1.0) == []          # packets 0, 1 acknowledged; resend from 2
    again = drain(req, 1.0)
    assert [p["psn"] for p in again] == [2, 3, 4]
    assert again[0]["opcode"] == roce.OP_RC_RDMA_WRITE_MIDDLE and again[0]["reth"] is None
    assert again[2]["opcode"] == roce.OP_RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
    assert req.counters.naks == 1 and req.counters.retransmitted_packets == 3
    assert req.counters.packets == 8


def test_local_ack_timeout_rewinds_then_fails_after_the_retry_limit():
    req = Requester(0, PAYLOAD, timeout_s=0.5, retry_limit=2)
    req.post(write(2 * PAYLOAD))
    drain(req, now=0.0)
    assert req.deadline() == 0.5
    assert not req.check_timeout(0.4)
    assert req.check_timeout(0.5)
    assert req.deadline() is None               # held back: no retransmission left yet
    assert not req.check_timeout(5.0)
    assert [p["psn"] for p in drain(req, 5.0)] == [0, 1]
    assert req.deadline() == 5.5 and req.counters.local_ack_timeout_err == 1
    assert req.check_timeout(5.5)
    drain(req, 5.5)
    with pytest.raises(TransportError, match="retry counter exceeded"):
        req.check_timeout(6.0)


def test_progress_resets_the_retry_counter():
    req = Requester(0, PAYLOAD, timeout_s=0.5, retry_limit=1)
    req.post(write(3 * PAYLOAD))
    drain(req, 0.0)
    assert req.check_timeout(0.5)
    drain(req, 0.5)
    req.on_ack(0, ACK, 0.6)                    # progress: timer restarts, retries back to 0
    assert req.retries == 0 and req.deadline() == pytest.approx(1.1)
    assert req.check_timeout(1.1)              # one retry allowed again, not an error


def test_responder_accepts_in_order_and_places_bytes():
    req = Requester(500, PAYLOAD)
    req.post(write(2 * PAYLOAD + 100, tag=9, vaddr=0x4000))
    resp = Responder(500)
    places, replies, completions = [], [], []
    for pkt in drain(req):
        parsed, _ = as_parsed(pkt)
        action = resp.on_packet(parsed)
        places.append((action.placement.vaddr, action.placement.length))
        replies.append(action.reply)
        completions.append(action.completion)
    assert places == [(0x4000, PAYLOAD), (0x4000 + PAYLOAD, PAYLOAD), (0x4000 + 2 * PAYLOAD, 100)]
    assert replies[-1] == (502, roce.AETH_ACK)
    assert completions[:2] == [None, None]
    assert (completions[2].immediate, completions[2].length, completions[2].vaddr) == (9, 2 * PAYLOAD + 100, 0x4000)
    assert resp.counters.packets == 3 and resp.counters.out_of_sequence == 0


def test_responder_naks_a_gap_once_and_counts_duplicates():
    req = Requester(0, PAYLOAD, ack_every=100)
    req.post(write(5 * PAYLOAD))
    pkts = [as_parsed(p)[0] for p in drain(req)]
    resp = Responder(0)
    assert resp.on_packet(pkts[0]).reply is None
    # packet 1 lost: 2, 3 arrive out of sequence; one NAK for the gap
    first = resp.on_packet(pkts[2])
    second = resp.on_packet(pkts[3])
    assert first.reply == (1, roce.AETH_NAK_PSN_SEQUENCE_ERROR) and first.placement is None
    assert second.reply is None
    assert resp.counters.out_of_sequence == 2 and resp.counters.packet_seq_err == 1
    # go-back-N: 1..4 again
    for p in pkts[1:]:
        assert resp.on_packet(p).placement is not None
    # a duplicate of the last packet (it asks for an ACK) is re-acknowledged
    dup = resp.on_packet(pkts[4])
    assert dup.reply == (4, roce.AETH_ACK) and dup.placement is None
    assert resp.counters.duplicate_request == 1
    assert resp.counters.completed == 1


def test_lossy_exchange_completes_with_go_back_n():
    """Requester and responder over a channel that drops every 7th packet: the message arrives
    whole, in order, exactly once."""
    req = Requester(0xFFFFF0, PAYLOAD, ack_every=4, timeout_s=0.1)
    resp = Responder(0xFFFFF0)
    for tag in range(5):
        req.post(write(10 * PAYLOAD + 4 * tag, tag=tag))
    completed, delivered = [], []
    now, sent = 0.0, 0
    while not req.idle and now < 10:
        while req.has_packet():
            pkt = drain_one(req, now)
            sent += 1
            if sent % 7 == 0:
                continue
            action = resp.on_packet(as_parsed(pkt)[0])
            if action.completion:
                delivered.append(action.completion.immediate)
            if action.reply:
                psn, syndrome = action.reply
                completed += [r.context for r in req.on_ack(psn, roce.Aeth(syndrome, 0), now)]
        now += 0.05
        req.check_timeout(now)
    assert delivered == [0, 1, 2, 3, 4] and completed == [0, 1, 2, 3, 4]
    assert resp.counters.bytes == sum(10 * PAYLOAD + 4 * t for t in range(5))
    assert req.counters.retransmitted_packets > 0


def drain_one(req, now):
    opcode, psn, ack_req, reth, imm, _request, offset, length = req.next_packet(now)
    return dict(opcode=opcode, psn=psn, ack_req=ack_req, reth=reth, imm=imm, offset=offset,
                length=length)


def test_ack_nak_and_cnp_packets_decode_in_scapy():
    ack = roce.build_ack_packet("10.1.1.1", "10.1.2.1", 0xC123, 0x101, 77, msn=5, dscp=46)
    pkt = IP(ack)
    assert pkt[UDP].dport == 4791 and pkt[BTH].opcode == roce.OP_RC_ACKNOWLEDGE
    assert pkt[BTH].psn == 77 and pkt[AETH].syndrome == roce.AETH_ACK and pkt[AETH].msn == 5
    assert pkt.tos >> 2 == 46 and roce.icrc_ok(ack)
    nak = roce.build_ack_packet("10.1.1.1", "10.1.2.1", 0xC123, 0x101, 9,
                                roce.AETH_NAK_PSN_SEQUENCE_ERROR)
    assert IP(nak)[AETH].syndrome == 0x60
    parsed = roce.parse_roce(nak[28:])
    assert parsed.aeth.is_nak and parsed.bth.psn == 9
    cnp = roce.build_cnp_packet("10.1.2.1", "10.1.1.1", 0xC123, 0x100)
    pkt = IP(cnp)
    assert pkt[BTH].opcode == roce.OP_CNP and pkt[BTH].becn == 1 and CNPPadding in pkt
    assert roce.parse_roce(cnp[28:]).payload_len == 0 and roce.icrc_ok(cnp)


def test_write_with_immediate_round_trip():
    payload = (0xABCD).to_bytes(4, "big") + bytes(range(64))
    datagram = roce.build_ipv4_udp_roce_packet("10.0.0.1", "10.0.0.2", 0xC000,
                                               roce.OP_RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, 5, 6,
                                               payload, reth=(0x20000000000, 4, 64))
    parsed = roce.parse_roce(datagram[28:])
    assert parsed.immediate == 0xABCD and parsed.reth.vaddr == 0x20000000000
    start = parsed.payload_offset
    assert datagram[28:][start:start + parsed.payload_len] == bytes(range(64))
    assert BTH in IP(datagram)


def test_cts_payload_round_trip():
    data = roce.build_bth(roce.OP_UC_SEND_ONLY, 1, 0) + roce.build_cts_payload(123456789) + bytes(4)
    assert roce.parse_cts_payload(data) == 123456789
    assert roce.parse_cts_payload(roce.build_bth(roce.OP_UC_SEND_ONLY, 1, 0) + bytes(16)) is None


# -- multipath: self-describing packets, paths, the placing responder ------------------------------

def drain_on(req, path, now=0.0, limit=None):
    """Packets the requester sends now on `path` (up to `limit`), as dicts."""
    out = []
    while req.has_packet() and (limit is None or len(out) < limit):
        opcode, psn, ack_req, reth, imm, _request, offset, length = req.next_packet(now, path)
        out.append(dict(opcode=opcode, psn=psn, ack_req=ack_req, reth=reth, imm=imm,
                        offset=offset, length=length))
    return out


def test_multipath_packets_each_carry_their_own_address():
    req = Requester(100, PAYLOAD, ack_every=2, self_describing=True, window=64)
    req.post(write(2 * PAYLOAD + 8, tag=5, vaddr=0x4000))
    pkts = drain_on(req, 0)
    assert [p["opcode"] for p in pkts] == [roce.OP_RC_RDMA_WRITE_ONLY] * 2 + [
        roce.OP_RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE]
    assert [p["reth"] for p in pkts] == [(0x4000, 2, PAYLOAD), (0x4000 + PAYLOAD, 2, PAYLOAD),
                                         (0x4000 + 2 * PAYLOAD, 2, 8)]
    assert pkts[-1]["imm"] == 5 and [p["ack_req"] for p in pkts] == [False, True, True]
    # genuine RoCEv2: scapy decodes the RETH of every one of them
    for pkt in pkts:
        _parsed, udp = as_parsed(pkt)
        assert BTH(udp).opcode == pkt["opcode"]


def test_the_window_holds_back_new_messages_not_retransmissions():
    req = Requester(0, PAYLOAD, self_describing=True, window=4)
    for tag in range(3):
        req.post(write(2 * PAYLOAD, tag=tag))
    assert len(drain_on(req, 0)) == 4                  # two messages fill the window
    assert not req.has_packet()
    req.on_ack(1, ACK, 0.1)                            # the first message is acknowledged
    assert [p["psn"] for p in drain_on(req, 0)] == [4, 5]
    assert req.check_timeout(10.0)                     # go-back-N still resends what is out
    assert [p["psn"] for p in drain_on(req, 0, 10.0)] == [2, 3, 4, 5]


def test_a_failed_path_resends_exactly_what_it_carried():
    req = Requester(0, PAYLOAD, ack_every=100, self_describing=True, window=64)
    req.post(write(8 * PAYLOAD, tag=1))
    sent = [drain_on(req, path, limit=1)[0]["psn"] for path in (0, 1, 2, 3, 0, 1, 2, 3)]
    assert sent == list(range(8))
    req.on_ack(1, ACK, 0.1)                            # 0 and 1 arrived
    assert req.resend_path(1) == 1                     # 5 went on path 1 (1 is acknowledged)
    assert req.resend_path(1) == 0                     # asked twice: still once
    assert req.resend_path(2) == 2                     # 2 and 6
    again = drain_on(req, 3, 0.2)
    assert [p["psn"] for p in again] == [2, 5, 6]      # in PSN order, before anything new
    assert req.counters.retransmitted_packets == 3
    req.on_ack(7, ACK, 0.3)
    assert req.idle
    with pytest.raises(ValueError, match="self-describing"):
        Requester(0, PAYLOAD).resend_path(0)


def test_a_path_resend_skips_what_an_ack_covered_meanwhile():
    req = Requester(0, PAYLOAD, ack_every=100, self_describing=True, window=64)
    req.post(write(4 * PAYLOAD, tag=1))
    drain_on(req, 7)
    assert req.resend_path(7) == 4
    req.on_ack(2, ACK, 0.1)                            # 0..2 arrived after all
    assert [p["psn"] for p in drain_on(req, 0)] == [3]


def _multipath_packets(npackets, tag=9, vaddr=0x8000, first_psn=0, ack_every=4):
    req = Requester(first_psn, PAYLOAD, ack_every=ack_every, self_describing=True, window=1024)
    req.post(write(npackets * PAYLOAD - 24, tag=tag, vaddr=vaddr))
    return req, [as_parsed(p)[0] for p in drain_on(req, 0)]


def test_the_placing_responder_places_out_of_order_and_acks_cumulatively():
    _req, pkts = _multipath_packets(6, first_psn=roce.PSN_MASK - 2)      # PSNs wrap
    resp = PlacingResponder(roce.PSN_MASK - 2, window=16)
    order = [1, 3, 0, 5, 2, 4]
    actions = [resp.on_packet(pkts[i]) for i in order]
    # every packet placed on arrival, at its own address
    assert [a.placement.vaddr for a in actions] == [0x8000 + i * PAYLOAD for i in order]
    # 1 and 3 came while 0 was expected, 5 while 2 was: 0, 2 and 4 each filled a hole
    assert resp.counters.out_of_sequence == 3
    assert resp.counters.reorder_depth_max == 3 and resp.counters.reorder_depth_sum == 1 + 3 + 3
    # packet 3 asked for an ACK (ack_every 4) and is acknowledged when 2 fills the hole below
    # it; the last packet when 4 does; 0 moved the cumulative PSN past 1, which asked nothing
    first = roce.PSN_MASK - 2
    assert [a.reply for a in actions] == [None, None, None, None,
                                          (roce.psn_add(first, 3), roce.AETH_ACK),
                                          (roce.psn_add(first, 5), roce.AETH_ACK)]
    # the message completes once, when all of it is in, with its start and whole length
    done = [c for a in actions for c in a.completions or ()]
    assert [(c.immediate, c.vaddr, c.length) for c in done] == [(9, 0x8000, 6 * PAYLOAD - 24)]
    assert actions[-1].completions == done and resp.counters.completed == 1
    assert resp.counters.packet_seq_err == 0          # reordering is never NAKed


def test_the_placing_responder_drops_duplicates_and_what_is_beyond_its_window():
    _req, pkts = _multipath_packets(8)
    resp = PlacingResponder(0, window=4)
    resp.on_packet(pkts[2])
    dup = resp.on_packet(pkts[2])                      # the same packet ahead, again
    assert dup.placement is None and resp.counters.duplicate_request == 1
    far = resp.on_packet(pkts[5])                      # beyond the bitmap
    assert far.placement is None and resp.counters.out_of_window == 1
    for i in (0, 1):
        resp.on_packet(pkts[i])
    behind = resp.on_packet(pkts[3 - 3])              # behind the cumulative PSN, asks no ACK
    assert behind.placement is None and resp.counters.duplicate_request == 2
    acked = resp.on_packet(pkts[3])                    # asks for an ACK: re-acknowledged
    assert acked.reply == (3, roce.AETH_ACK)
    dup_behind = resp.on_packet(pkts[3])
    assert dup_behind.reply == (3, roce.AETH_ACK) and dup_behind.placement is None
    with pytest.raises(ValueError, match="window"):
        PlacingResponder(0, window=0)


def test_a_lost_packet_is_recovered_and_reordering_costs_nothing():
    """Two messages over four paths, delivered in a scrambled order, one packet lost: the ACK
    timeout resends, the bitmap drops the duplicates, each message completes once, in order."""
    rng = __import__("random").Random(4)
    req = Requester(7, PAYLOAD, ack_every=4, timeout_s=0.1, self_describing=True, window=256)
    resp = PlacingResponder(7, window=512)
    for tag in (1, 2):
        req.post(write(10 * PAYLOAD, tag=tag, vaddr=0x1000 * tag * 16))
    now, lost, delivered, completed, placed = 0.0, None, [], [], set()
    while not req.idle and now < 5:
        batch = []
        while req.has_packet():
            path = len(batch) % 4
            opcode, psn, ack_req, reth, imm, _r, off, length = req.next_packet(now, path)
            batch.append(dict(opcode=opcode, psn=psn, ack_req=ack_req, reth=reth, imm=imm,
                              offset=off, length=length))
        rng.shuffle(batch)
        for pkt in batch:
            if lost is None and pkt["psn"] == 12:
                lost = pkt["psn"]
                continue
            action = resp.on_packet(as_parsed(pkt)[0])
            if action.placement is not None:
                placed.add(action.placement.vaddr)
            delivered += [c.immediate for c in action.completions or ()]
            if action.reply:
                completed += [r.context for r in req.on_ack(action.reply[0], ACK, now)]
        now += 0.05
        req.check_timeout(now)
    assert delivered == [1, 2] and completed == [1, 2]
    assert len(placed) == 20 and req.counters.local_ack_timeout_err >= 1
    assert resp.counters.bytes == 20 * PAYLOAD         # every byte placed exactly once
    assert resp.counters.out_of_sequence > 0 and resp.counters.duplicate_request > 0


def test_a_hole_older_than_the_reorder_timeout_is_naked_and_resent_alone():
    req, pkts = _multipath_packets(6, ack_every=100)
    resp = PlacingResponder(0, window=16, hole_timeout_s=0.1)
    for i in (2, 3, 4):                                # 0 and 1 were lost together
        resp.on_packet(pkts[i], now=0.01)
    assert resp.check_hole(0.05) is None               # still reordering, perhaps
    assert resp.check_hole(0.11) == (0, roce.AETH_NAK_PSN_SEQUENCE_ERROR)
    assert resp.check_hole(0.15) is None               # NAKed once per timeout...
    assert resp.check_hole(0.22) == (0, roce.AETH_NAK_PSN_SEQUENCE_ERROR)    # ... then again
    # the requester resends the NAKed packet only (selective repeat), not everything after it
    completed = req.on_ack(0, NAK, 0.22)
    assert completed == [] and [p["psn"] for p in drain_on(req, 1, 0.22)] == [0]
    assert req.counters.retransmitted_packets == 1 and req.counters.naks == 1
    resp.on_packet(pkts[0], now=0.25)
    # the next hole (1) is as old as the arrivals beyond it: NAKed at once, not a timeout later
    assert resp.check_hole(0.25) == (1, roce.AETH_NAK_PSN_SEQUENCE_ERROR)
    assert resp.counters.holes_naked == 3 == resp.counters.packet_seq_err
    resp.on_packet(pkts[1], now=0.3)
    resp.on_packet(pkts[5], now=0.3)
    assert resp.hole_since is None and resp.check_hole(10.0) is None
    assert resp.counters.completed == 1


def test_without_a_hole_timeout_the_placing_responder_never_naks():
    _req, pkts = _multipath_packets(4)
    resp = PlacingResponder(0, window=16)
    resp.on_packet(pkts[3], now=0.0)
    assert resp.check_hole(1e6) is None
    with pytest.raises(ValueError, match="hole timeout"):
        PlacingResponder(0, window=16, hole_timeout_s=0)


def test_a_packet_sent_again_asks_for_an_ack():
    """A duplicate that asked nothing would be answered by nothing: retransmissions ask."""
    req = Requester(0, PAYLOAD, ack_every=16, timeout_s=0.5)
    req.post(write(4 * PAYLOAD))
    first = drain(req, 0.0)
    assert [p["ack_req"] for p in first] == [False, False, False, True]
    assert req.check_timeout(0.5)
    again = drain(req, 0.6)
    assert [p["ack_req"] for p in again] == [True] * 4
    resp = Responder(0)
    for pkt in first:
        resp.on_packet(as_parsed(pkt)[0])
    assert resp.on_packet(as_parsed(again[0])[0]).reply == (3, roce.AETH_ACK)   # a duplicate, answered


# -- SENDs, plain WRITEs, RNR and invalid requests (what a kernel's soft-RoCE QP sends and expects)


def send(length, imm=None, context=1):
    return WriteRequest(length, 0, 0, immediate=imm, context=context, send=True)


def test_a_send_is_first_middle_last_with_no_reth_and_lands_in_the_posted_receive():
    from fabriclab.traffic.transport import ReceiveRequest

    req = Requester(10, PAYLOAD)
    req.post(send(2 * PAYLOAD + 3, imm=0xABCD))
    pkts = drain(req)
    assert [p["opcode"] for p in pkts] == [roce.OP_RC_SEND_FIRST, roce.OP_RC_SEND_MIDDLE,
                                           roce.OP_RC_SEND_LAST_WITH_IMMEDIATE]
    assert all(p["reth"] is None for p in pkts) and pkts[-1]["imm"] == 0xABCD
    resp = Responder(10)
    resp.post_receive(ReceiveRequest(0x5000, 4 * PAYLOAD, context="r0"))
    actions = [resp.on_packet(as_parsed(p)[0]) for p in pkts]
    places = [(a.placement.rkey, a.placement.vaddr, a.placement.length) for a in actions]
    assert places == [(None, 0x5000, PAYLOAD), (None, 0x5000 + PAYLOAD, PAYLOAD),
                      (None, 0x5000 + 2 * PAYLOAD, 3)]
    done = actions[-1].completion
    assert (done.send, done.immediate, done.vaddr, done.length, done.context) == \
        (True, 0xABCD, 0x5000, 2 * PAYLOAD + 3, "r0")
    assert actions[-1].reply == (12, roce.AETH_ACK) and resp.msn == 1 and not resp.receives
    # and without immediate data: SEND ONLY, still a completion (a SEND always consumes a receive)
    req.post(send(5))
    (only,) = drain(req)
    assert only["opcode"] == roce.OP_RC_SEND_ONLY and only["imm"] is None
    resp.post_receive(ReceiveRequest(0x9000, 64, context="r1"))
    done = resp.on_packet(as_parsed(only)[0]).completion
    assert (done.send, done.immediate, done.length, done.context) == (True, None, 5, "r1")


def test_a_write_without_immediate_places_and_completes_nothing_towards_the_application():
    req = Requester(0, PAYLOAD)
    req.post(WriteRequest(PAYLOAD + 1, 0x2000, 9, immediate=None))
    pkts = drain(req)
    assert [p["opcode"] for p in pkts] == [roce.OP_RC_RDMA_WRITE_FIRST, roce.OP_RC_RDMA_WRITE_LAST]
    resp = Responder(0)
    actions = [resp.on_packet(as_parsed(p)[0]) for p in pkts]
    assert [a.placement.vaddr for a in actions] == [0x2000, 0x2000 + PAYLOAD]
    assert all(a.completion is None for a in actions) and resp.msn == 1
    assert resp.expected == 2


def test_a_send_with_no_receive_posted_gets_an_rnr_nak_and_is_sent_again_after_its_timer():
    from fabriclab.traffic.transport import ReceiveRequest

    req = Requester(50, PAYLOAD, timeout_s=5.0)
    req.post(write(8, tag=1))
    req.post(send(8, context=2))
    first, second = drain(req, now=0.0)
    resp = Responder(50, rnr_timer=roce.rnr_timer_code(0.01))
    assert resp.on_packet(as_parsed(first)[0]).reply == (50, roce.AETH_ACK)
    action = resp.on_packet(as_parsed(second)[0])
    assert action.placement is None and resp.expected == 51            # not accepted
    psn, syndrome = action.reply
    assert psn == 51 and syndrome & roce.AETH_TYPE_MASK == roce.AETH_TYPE_RNR
    assert resp.counters.rnr_naks_sent == 1
    # Before the fix an RNR NAK (type 001) read as an ACK of PSN 51: the SEND "completed" unseen.
    aeth = roce.Aeth(syndrome, resp.msn)
    assert aeth.is_rnr and not aeth.is_nak
    done = req.on_ack(psn, aeth, now=1.0)
    assert [r.context for r in done] == [1]                             # the write, not the send
    assert req.counters.rnr_naks == 1 and req.rnr_until == pytest.approx(1.0 + roce.rnr_timer_s(
        syndrome & 0x1F))
    assert req.has_packet() and not req.ready(1.0) and req.ready(1.011)
    assert req.deadline() is None                                       # no ACK timer meanwhile
    (again,) = drain(req, now=1.011)
    assert again["psn"] == 51 and again["opcode"] == roce.OP_RC_SEND_ONLY
    resp.post_receive(ReceiveRequest(0, 8))
    action = resp.on_packet(as_parsed(again)[0])
    assert action.completion.send and action.reply == (51, roce.AETH_ACK)
    assert [r.context for r in req.on_ack(51, ACK, now=1.1)] == [2] and req.rnr_until is None


def test_rnr_retries_run_out_unless_seven():
    for limit, fails in ((1, True), (7, False)):
        req = Requester(0, PAYLOAD, rnr_retry=limit)
        req.post(send(4))
        rnr = roce.Aeth(roce.AETH_RNR_NAK | 1, 0)
        for attempt in range(3):
            drain(req, now=attempt)
            if fails and attempt == 1:
                with pytest.raises(TransportError, match="RNR retry counter exceeded"):
                    req.on_ack(0, rnr, now=attempt)
                break
            req.on_ack(0, rnr, now=attempt)
        else:
            assert req.counters.rnr_naks == 3 and not fails


def test_the_rnr_timer_codes_follow_the_ibta_table():
    assert roce.rnr_timer_s(0) == pytest.approx(0.65536)
    assert roce.rnr_timer_s(1) == pytest.approx(10e-6) and roce.rnr_timer_s(31) == pytest.approx(0.49152)
    assert roce.rnr_timer_code(0.001) == 14 and roce.rnr_timer_s(14) == pytest.approx(0.00128)
    assert roce.rnr_timer_code(10.0) == 0
    with pytest.raises(ValueError):
        roce.rnr_timer_s(32)


def test_messages_that_break_the_opcode_order_or_overrun_are_invalid_requests():
    from fabriclab.traffic.transport import ReceiveRequest

    req = Requester(0, PAYLOAD)
    req.post(write(2 * PAYLOAD, tag=3))
    first, last = drain(req)
    resp = Responder(1)                       # a LAST with no FIRST before it
    action = resp.on_packet(as_parsed(last)[0])
    assert action.reply == (1, roce.AETH_NAK_INVALID_REQUEST) and action.placement is None
    assert resp.expected == 1 and resp.counters.invalid_request == 1
    resp = Responder(0)                       # a FIRST while another message is under way
    resp.on_packet(as_parsed(first)[0])
    req2 = Requester(1, PAYLOAD)
    req2.post(write(8))
    action = resp.on_packet(as_parsed(drain(req2)[0])[0])
    assert action.reply == (1, roce.AETH_NAK_INVALID_REQUEST)
    # a SEND longer than its receive buffer
    req3 = Requester(0, PAYLOAD)
    req3.post(send(100))
    resp = Responder(0)
    resp.post_receive(ReceiveRequest(0, 64))
    action = resp.on_packet(as_parsed(drain(req3)[0])[0])
    assert action.reply == (0, roce.AETH_NAK_INVALID_REQUEST) and action.placement is None
    # a WRITE whose RETH says more than its packets carry
    resp = Responder(0)
    parsed, _ = as_parsed(dict(opcode=roce.OP_RC_RDMA_WRITE_ONLY, psn=0, ack_req=True,
                               reth=(0, 1, 64), imm=None, length=8))
    assert resp.on_packet(parsed).reply == (0, roce.AETH_NAK_INVALID_REQUEST)


def test_a_multipath_requester_refuses_sends():
    with pytest.raises(ValueError, match="SEND"):
        Requester(0, PAYLOAD, self_describing=True, window=64).post(send(8))
