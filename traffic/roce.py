"""The RoCEv2 wire format: IPv4 + UDP (port 4791) + InfiniBand transport headers + ICRC.

Pure Python (struct and zlib) so that the traffic agents can build and parse packets at a few
tens of thousands of packets per second without scapy in the data path. Scapy's
`scapy.contrib.roce` describes the same headers and is what the tests decode our bytes with.

What a packet looks like (RC RDMA WRITE, the bulk of a collective's traffic)::

    IPv4 (DSCP/ECN, DF) | UDP sport -> 4791, checksum 0 | BTH (12) | RETH (16, FIRST/ONLY only)
    | payload (+0..3 pad bytes) | ICRC (4)

Why the pieces matter to the lab:

- The UDP destination port is always 4791, so a switch hashing the 5-tuple sees entropy only in
  the addresses and the UDP *source* port. RDMA stacks derive that source port from the QP pair
  (`udp_source_port`); when they do not (a fixed flow label per NIC pair), every QP of the pair
  shares one source port and QP scaling adds no entropy -- the corner case in the seed paper's
  section 4.2. The destination QP in the BTH is what "Enhanced ECMP" hashes on instead.
- The PSN lets a receiver count out-of-order arrivals, which packet spraying and flowlets cause.
- The ICRC is checked by real RoCE NICs (and by soft-RoCE); a packet with a wrong ICRC is dropped
  silently, so the agents compute it exactly as the specification defines.
"""

import ipaddress
import struct
import zlib
from functools import lru_cache
from typing import NamedTuple

# -- constants ------------------------------------------------------------------------------------

ROCEV2_UDP_PORT = 4791
"""IANA-assigned UDP destination port of RoCEv2; every RoCEv2 packet carries it."""

IPPROTO_UDP = 17
IPV4_HEADER_LEN = 20
UDP_HEADER_LEN = 8
BTH_LEN = 12
RETH_LEN = 16
AETH_LEN = 4
CNP_PADDING_LEN = 16
ICRC_LEN = 4
ETH_HEADER_LEN = 14
"""Ethernet header (no FCS, preamble or gap): what interface counters and htb add per frame."""

ROCE_OVERHEAD = IPV4_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN + ICRC_LEN
"""Bytes of an IPv4 RoCEv2 datagram that are not RDMA payload, for a packet without RETH/AETH."""

# Reliable Connection opcodes (transport bits 000 in the top three bits of the opcode).
OP_RC_SEND_FIRST = 0x00
OP_RC_SEND_MIDDLE = 0x01
OP_RC_SEND_LAST = 0x02
OP_RC_SEND_LAST_WITH_IMMEDIATE = 0x03
OP_RC_SEND_ONLY = 0x04
OP_RC_SEND_ONLY_WITH_IMMEDIATE = 0x05
OP_RC_RDMA_WRITE_FIRST = 0x06
OP_RC_RDMA_WRITE_MIDDLE = 0x07
OP_RC_RDMA_WRITE_LAST = 0x08
OP_RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09
OP_RC_RDMA_WRITE_ONLY = 0x0A
OP_RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0B
OP_RC_ACKNOWLEDGE = 0x11
OP_CNP = 0x81
"""Congestion Notification Packet (RoCEv2 annex): a receiver that saw ECN CE sends it (DCQCN)."""

OPCODE_NAMES = {
    OP_RC_SEND_FIRST: "RC_SEND_FIRST",
    OP_RC_SEND_MIDDLE: "RC_SEND_MIDDLE",
    OP_RC_SEND_LAST: "RC_SEND_LAST",
    OP_RC_SEND_LAST_WITH_IMMEDIATE: "RC_SEND_LAST_WITH_IMMEDIATE",
    OP_RC_SEND_ONLY: "RC_SEND_ONLY",
    OP_RC_SEND_ONLY_WITH_IMMEDIATE: "RC_SEND_ONLY_WITH_IMMEDIATE",
    OP_RC_RDMA_WRITE_FIRST: "RC_RDMA_WRITE_FIRST",
    OP_RC_RDMA_WRITE_MIDDLE: "RC_RDMA_WRITE_MIDDLE",
    OP_RC_RDMA_WRITE_LAST: "RC_RDMA_WRITE_LAST",
    OP_RC_RDMA_WRITE_LAST_WITH_IMMEDIATE: "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
    OP_RC_RDMA_WRITE_ONLY: "RC_RDMA_WRITE_ONLY",
    OP_RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
    OP_RC_ACKNOWLEDGE: "RC_ACKNOWLEDGE",
    OP_CNP: "CNP",
}

# Opcodes followed by a RETH (first packet of an RDMA WRITE carries the target buffer) or an AETH.
RETH_OPCODES = frozenset({
    OP_RC_RDMA_WRITE_FIRST, OP_RC_RDMA_WRITE_ONLY, OP_RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
})
AETH_OPCODES = frozenset({OP_RC_ACKNOWLEDGE})
IMMDT_OPCODES = frozenset({
    OP_RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, OP_RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
    OP_RC_SEND_LAST_WITH_IMMEDIATE, OP_RC_SEND_ONLY_WITH_IMMEDIATE,
})
SEND_OPCODES = frozenset(range(OP_RC_SEND_FIRST, OP_RC_SEND_ONLY_WITH_IMMEDIATE + 1))
"""An RC SEND's packets: the responder places them in the receive buffer its next posted
receive request names (no RETH)."""
FIRST_OPCODES = frozenset({OP_RC_SEND_FIRST, OP_RC_SEND_ONLY, OP_RC_SEND_ONLY_WITH_IMMEDIATE,
                           OP_RC_RDMA_WRITE_FIRST, OP_RC_RDMA_WRITE_ONLY,
                           OP_RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE})
"""The packets that start a message (FIRST or ONLY)."""
LAST_OPCODES = frozenset({OP_RC_SEND_LAST, OP_RC_SEND_LAST_WITH_IMMEDIATE, OP_RC_SEND_ONLY,
                          OP_RC_SEND_ONLY_WITH_IMMEDIATE, OP_RC_RDMA_WRITE_LAST,
                          OP_RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, OP_RC_RDMA_WRITE_ONLY,
                          OP_RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE})
"""The packets that end a message (LAST or ONLY)."""

DEFAULT_PKEY = 0xFFFF
"""The default partition key (full membership); RoCE fabrics rarely use others."""

# ECN codepoints (the two low bits of the IPv4 TOS byte).
ECN_NOT_ECT = 0
ECN_ECT1 = 1
ECN_ECT0 = 2
ECN_CE = 3

DEFAULT_DSCP = 26
"""DSCP 26 (AF31) is the common lossless RoCE traffic class (PFC priority 3) in vendor guides."""
DEFAULT_ECN = ECN_ECT0
"""RoCE NICs send ECT(0) so that switches can mark CE instead of dropping (DCQCN)."""
DEFAULT_TTL = 64

QPN_MASK = 0xFFFFFF
PSN_MASK = 0xFFFFFF
PSN_MODULUS = 1 << 24
FLOW_LABEL_MASK = 0xFFFFF
"""IPv6/GRH flow labels are 20 bits; RoCEv2 folds them into the UDP source port."""
ROCE_UDP_SPORT_MIN = 0xC000
"""RoCEv2 source ports live in 0xC000-0xFFFF: the top two bits set, 14 bits of entropy."""

_ICRC_SEED = b"\xff" * 8
"""The ICRC starts over 8 bytes of ones: the masked LRH stand-in ("pseudo LRH") of RoCEv2."""


# -- BTH ------------------------------------------------------------------------------------------

class Bth(NamedTuple):
    """A parsed Base Transport Header (12 bytes, InfiniBand spec section 9.2)."""

    opcode: int
    solicited: bool
    migreq: bool
    pad_count: int
    tver: int
    pkey: int
    fecn: bool
    becn: bool
    dest_qp: int
    ack_req: bool
    psn: int
    resv6: int = 0
    resv7: int = 0


def _check_range(name, value, low, high):
    if type(value) is int and low <= value <= high:
        return          # the common case, first: a dozen checks per packet built
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in {low}..{high}, got {value!r}")


def build_bth(opcode, dest_qp, psn, *, solicited=False, migreq=False, pad_count=0, tver=0,
              pkey=DEFAULT_PKEY, fecn=False, becn=False, ack_req=False):
    """Pack a BTH.

    Layout: opcode(8) | SE(1) M(1) PadCnt(2) TVer(4) | P_Key(16) | FECN(1) BECN(1) resv6(6) |
    DestQP(24) | A(1) resv7(7) | PSN(24). FECN/BECN are the RoCEv2 congestion bits carved from
    the spec's 8-bit reserved field (resv8a); the reserved bits are sent as zero.
    """
    _check_range("opcode", opcode, 0, 0xFF)
    _check_range("dest_qp", dest_qp, 0, QPN_MASK)
    _check_range("psn", psn, 0, PSN_MASK)
    _check_range("pad_count", pad_count, 0, 3)
    _check_range("tver", tver, 0, 0xF)
    _check_range("pkey", pkey, 0, 0xFFFF)
    flags = (bool(solicited) << 7) | (bool(migreq) << 6) | (pad_count << 4) | tver
    word2 = (bool(fecn) << 31) | (bool(becn) << 30) | dest_qp
    word3 = (bool(ack_req) << 31) | psn
    return struct.pack("!BBHII", opcode, flags, pkey, word2, word3)


def parse_bth(data):
    """Unpack the first 12 bytes of `data` (the UDP payload of a RoCEv2 packet) as a `Bth`."""
    if len(data) < BTH_LEN:
        raise ValueError(f"a BTH needs {BTH_LEN} bytes, got {len(data)}")
    opcode, flags, pkey, word2, word3 = struct.unpack_from("!BBHII", data)
    return Bth(
        opcode=opcode,
        solicited=bool(flags & 0x80),
        migreq=bool(flags & 0x40),
        pad_count=(flags >> 4) & 0x3,
        tver=flags & 0xF,
        pkey=pkey,
        fecn=bool(word2 >> 31),
        becn=bool((word2 >> 30) & 1),
        dest_qp=word2 & QPN_MASK,
        ack_req=bool(word3 >> 31),
        psn=word3 & PSN_MASK,
        resv6=(word2 >> 24) & 0x3F,
        resv7=(word3 >> 24) & 0x7F,
    )


def psn_add(psn, n=1):
    """PSNs are 24-bit and wrap; all PSN arithmetic goes through here."""
    return (psn + n) & PSN_MASK


def psn_behind(psn, expected):
    """True if `psn` is before `expected` in 24-bit serial-number order (duplicate or late).

    Half the PSN space counts as "behind", as an RC responder treats it.
    """
    return 0 < ((expected - psn) & PSN_MASK) < (PSN_MODULUS >> 1)


# -- RETH -----------------------------------------------------------------------------------------

class Reth(NamedTuple):
    """RDMA Extended Transport Header: where in the responder's memory a WRITE lands."""

    vaddr: int
    rkey: int
    dma_len: int


def build_reth(vaddr, rkey, dma_len):
    """Pack a RETH: virtual address (64), R_Key (32), DMA length (32) = total message bytes."""
    _check_range("vaddr", vaddr, 0, (1 << 64) - 1)
    _check_range("rkey", rkey, 0, 0xFFFFFFFF)
    _check_range("dma_len", dma_len, 0, 0xFFFFFFFF)
    return struct.pack("!QII", vaddr, rkey, dma_len)


def parse_reth(data, offset=BTH_LEN):
    """Unpack the RETH that follows the BTH in a FIRST/ONLY RDMA WRITE packet."""
    if len(data) < offset + RETH_LEN:
        raise ValueError(f"a RETH needs {RETH_LEN} bytes at offset {offset}, "
                         f"got {len(data)} in all")
    return Reth(*struct.unpack_from("!QII", data, offset))


# -- message segmentation -------------------------------------------------------------------------

# (FIRST, MIDDLE, LAST, LAST WITH IMMEDIATE, ONLY, ONLY WITH IMMEDIATE) of a message's packets
_WRITE_OPS = (OP_RC_RDMA_WRITE_FIRST, OP_RC_RDMA_WRITE_MIDDLE, OP_RC_RDMA_WRITE_LAST,
              OP_RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, OP_RC_RDMA_WRITE_ONLY, OP_RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE)
_SEND_OPS = (OP_RC_SEND_FIRST, OP_RC_SEND_MIDDLE, OP_RC_SEND_LAST, OP_RC_SEND_LAST_WITH_IMMEDIATE,
             OP_RC_SEND_ONLY, OP_RC_SEND_ONLY_WITH_IMMEDIATE)


def _message_opcode(ops, index, npackets, immediate):
    first, middle, last, last_imm, only, only_imm = ops
    if npackets == 1:
        return only_imm if immediate else only
    if index == 0:
        return first
    if index == npackets - 1:
        return last_imm if immediate else last
    return middle


def write_opcode(index, npackets, immediate=False):
    """The opcode of packet `index` of an RC RDMA WRITE of `npackets` packets: ONLY for a
    one-packet message, else FIRST, MIDDLE..., LAST. With `immediate` the last packet (ONLY or
    LAST) is the WITH IMMEDIATE variant, which carries the 4-byte immediate data."""
    return _message_opcode(_WRITE_OPS, index, npackets, immediate)


def send_opcode(index, npackets, immediate=False):
    """The opcode of packet `index` of an RC SEND of `npackets` packets, as `write_opcode` for
    a WRITE: ONLY, or FIRST, MIDDLE..., LAST; `immediate` makes the last one WITH IMMEDIATE."""
    return _message_opcode(_SEND_OPS, index, npackets, immediate)


def write_message_segments(message_bytes, payload_bytes):
    """Split one RDMA WRITE of `message_bytes` into (opcode, payload_length) per packet.

    Every packet but the last carries exactly `payload_bytes` (the path MTU's payload), as the
    InfiniBand spec requires of a requester.
    """
    _check_range("message_bytes", message_bytes, 1, 0xFFFFFFFF)
    _check_range("payload_bytes", payload_bytes, 1, 1 << 16)
    full, rest = divmod(message_bytes, payload_bytes)
    sizes = [payload_bytes] * full + ([rest] if rest else [])
    return [(write_opcode(i, len(sizes)), size) for i, size in enumerate(sizes)]


def roce_payload_length(udp_payload_len, bth):
    """RDMA payload bytes in a RoCEv2 UDP payload of `udp_payload_len` bytes with header `bth`.

    Subtracts the BTH, the extended headers the opcode implies, the pad bytes and the ICRC.
    Returns -1 if the length is too short to hold them (a malformed packet).
    """
    header = BTH_LEN
    if bth.opcode in RETH_OPCODES:
        header += RETH_LEN
    if bth.opcode in AETH_OPCODES:
        header += AETH_LEN
    if bth.opcode in IMMDT_OPCODES:
        header += 4
    if bth.opcode == OP_CNP:
        header += CNP_PADDING_LEN
    length = udp_payload_len - header - bth.pad_count - ICRC_LEN
    return length if length >= 0 else -1


# -- ICRC -----------------------------------------------------------------------------------------

def compute_icrc(datagram):
    """The 4-byte ICRC of an IPv4 RoCEv2 datagram whose last 4 bytes are the ICRC slot.

    RoCEv2 (IBTA annex A17) defines the ICRC as a CRC-32 (the Ethernet/zlib polynomial) over
    8 bytes of 0xFF, then the IPv4 header with TOS, TTL and header checksum set to ones, the UDP
    header with its checksum set to ones, the BTH with its resv8a byte (FECN, BECN, resv6) set to
    ones, then everything after the BTH up to the ICRC. Those are exactly the fields a router may
    rewrite in flight (ECN marking, TTL decrement, the checksums that follow), so the ICRC
    survives a routed fabric. The IP total length and UDP length include the 4 ICRC bytes.

    The CRC is stored least significant byte first (Linux rxe stores the inverted CRC state in
    CPU order; scapy's `BTH.pack_icrc` reverses the big-endian value): the same bytes both emit.
    """
    data = bytearray(datagram[:-ICRC_LEN])
    if len(data) < IPV4_HEADER_LEN:
        raise ValueError("datagram shorter than an IPv4 header")
    ihl = (data[0] & 0x0F) * 4
    if data[0] >> 4 != 4 or ihl < IPV4_HEADER_LEN:
        raise ValueError("not an IPv4 datagram")
    if len(data) < ihl + UDP_HEADER_LEN + BTH_LEN:
        raise ValueError("datagram too short for IPv4 + UDP + BTH")
    data[1] = 0xFF                              # TOS (DSCP + ECN)
    data[8] = 0xFF                              # TTL
    data[10:12] = b"\xff\xff"                   # header checksum
    data[ihl + 6:ihl + 8] = b"\xff\xff"         # UDP checksum
    data[ihl + UDP_HEADER_LEN + 4] = 0xFF       # BTH resv8a: FECN, BECN, resv6
    crc = zlib.crc32(data, zlib.crc32(_ICRC_SEED))
    return struct.pack("<I", crc)


def icrc_ok(datagram):
    """True if the last 4 bytes of an IPv4 RoCEv2 datagram are its correct ICRC."""
    return compute_icrc(datagram) == bytes(datagram[-ICRC_LEN:])


# -- IPv4 + UDP + RoCE ----------------------------------------------------------------------------

@lru_cache(maxsize=4096)
def _packed_ipv4(address):
    return ipaddress.IPv4Address(address).packed


def ipv4_checksum(header):
    """The Internet checksum of an IPv4 header whose checksum field holds zero."""
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def build_ipv4_udp_roce_packet(src, dst, sport, opcode, dest_qp, psn, payload=b"", *,
                               reth=None, ack_req=False, solicited=False, fecn=False, becn=False,
                               pkey=DEFAULT_PKEY, dscp=DEFAULT_DSCP, ecn=DEFAULT_ECN, ip_id=1,
                               ttl=DEFAULT_TTL, dont_fragment=True, dport=ROCEV2_UDP_PORT):
    """A complete IPv4 RoCEv2 datagram: IPv4 | UDP | BTH | [RETH] | payload + pad | ICRC.

    `reth` is a `Reth` (or a (vaddr, rkey, dma_len) tuple) for FIRST/ONLY WRITE packets. The
    payload is padded to a multiple of 4 bytes and the BTH pad count says how many bytes were
    added, as the transport requires. The UDP checksum is 0 ("none"), which IPv4 RoCEv2 allows and
    NICs send; the ICRC protects the payload instead. DF is set as RoCE NICs do: a RoCE packet
    must never be fragmented. `ip_id` is ours: note that Linux replaces an ID of 0 on raw sockets,
    which would break the ICRC, so callers that send through IP_HDRINCL must avoid 0.
    """
    _check_range("sport", sport, 0, 0xFFFF)
    _check_range("dport", dport, 0, 0xFFFF)
    _check_range("dscp", dscp, 0, 63)
    _check_range("ecn", ecn, 0, 3)
    _check_range("ip_id", ip_id, 0, 0xFFFF)
    _check_range("ttl", ttl, 0, 0xFF)
    pad = -len(payload) % 4
    bth = build_bth(opcode, dest_qp, psn, solicited=solicited, pad_count=pad, pkey=pkey,
                    fecn=fecn, becn=becn, ack_req=ack_req)
    ext = build_reth(*reth) if reth is not None else b""
    udp_len = UDP_HEADER_LEN + BTH_LEN + len(ext) + len(payload) + pad + ICRC_LEN
    total_len = IPV4_HEADER_LEN + udp_len
    if total_len > 0xFFFF:
        raise ValueError(f"datagram of {total_len} bytes exceeds the IPv4 maximum")
    header = bytearray(struct.pack(
        "!BBHHHBBH4s4s", 0x45, (dscp << 2) | ecn, total_len, ip_id,
        0x4000 if dont_fragment else 0, ttl, IPPROTO_UDP, 0, _packed_ipv4(src), _packed_ipv4(dst)))
    struct.pack_into("!H", header, 10, ipv4_checksum(header))
    udp = struct.pack("!HHHH", sport, dport, udp_len, 0)
    datagram = bytes(header) + udp + bth + ext + bytes(payload) + b"\x00" * pad + b"\x00" * ICRC_LEN
    return datagram[:-ICRC_LEN] + compute_icrc(datagram)


# -- UDP source port (entropy) --------------------------------------------------------------------

def calc_flow_label(local_qpn, remote_qpn):
    """A 20-bit flow label from a QP pair, as Linux `rdma_calc_flow_label` makes it.

    The product of the two 24-bit QP numbers is folded (xor with itself shifted by 20 and by 40)
    into 20 bits. The product is symmetric, so both ends of a connection compute the same label.
    """
    _check_range("local_qpn", local_qpn, 0, QPN_MASK)
    _check_range("remote_qpn", remote_qpn, 0, QPN_MASK)
    value = local_qpn * remote_qpn
    value ^= value >> 20
    value ^= value >> 40
    return value & FLOW_LABEL_MASK


def flow_label_to_udp_sport(flow_label):
    """Fold a 20-bit flow label into a RoCEv2 UDP source port (`rdma_flow_label_to_udp_sport`).

    The top 6 bits are xored into the low 14, and the result is ORed with 0xC000.
    """
    _check_range("flow_label", flow_label, 0, FLOW_LABEL_MASK)
    low = flow_label & 0x3FFF
    low ^= (flow_label & 0xFC000) >> 14
    return ROCE_UDP_SPORT_MIN | low


def nic_pair_flow_label(src, dst):
    """A fixed, non-zero flow label for a NIC pair (symmetric in the two addresses).

    Models the corner case of the seed paper's section 4.2: when a flow label is set on the
    address handle (by the application, the CM or a driver default) Linux uses it instead of the
    QP pair, so every QP between the two NICs gets the same UDP source port.
    """
    low, high = sorted((_packed_ipv4(src), _packed_ipv4(dst)))
    return (zlib.crc32(low + high) & FLOW_LABEL_MASK) or 1


def udp_source_port(local_qpn, remote_qpn, flow_label=0, *, shared=False, src=None, dst=None):
    """The UDP source port a Linux RoCEv2 stack picks for a connection (`rdma_get_udp_sport`).

    With `flow_label` 0 the label comes from the QP pair (`calc_flow_label`), so distinct QPs of
    the same NIC pair spread over up to 2**14 source ports -- the entropy that QP scaling relies
    on. A non-zero `flow_label` wins over the QPs. `shared=True` (with `src` and `dst`) selects
    the shared-source-port corner case: the label is `nic_pair_flow_label(src, dst)`, so all
    QPs between the two NICs send from one port and ECMP cannot tell them apart.
    """
    _check_range("local_qpn", local_qpn, 0, QPN_MASK)
    _check_range("remote_qpn", remote_qpn, 0, QPN_MASK)
    if shared:
        if src is None or dst is None:
            raise ValueError("shared source ports need the NIC pair's src and dst addresses")
        if flow_label:
            raise ValueError("give either a flow label or shared=True, not both")
        flow_label = nic_pair_flow_label(src, dst)
    if not flow_label:
        flow_label = calc_flow_label(local_qpn, remote_qpn)
    return flow_label_to_udp_sport(flow_label)


ROCE_PATH_MTUS = (4096, 2048, 1024, 512, 256)
"""The InfiniBand path MTUs a RoCE NIC can use (the RDMA payload per packet)."""


def path_mtu_for(ethernet_mtu):
    """The largest RoCE path MTU whose packets (with a RETH) fit an Ethernet MTU, as NICs pick."""
    for payload in ROCE_PATH_MTUS:
        if payload + ROCE_OVERHEAD + RETH_LEN <= ethernet_mtu:
            return payload
    raise ValueError(f"an Ethernet MTU of {ethernet_mtu} cannot carry a 256-byte RoCE payload")


# -- AETH, ACK/NAK, CNP, immediate data -----------------------------------------------------------

OP_UC_SEND_ONLY = 0x24
"""Unreliable Connected SEND ONLY: the lab's clear-to-send (CTS) notifications ride on it.

A CTS is a control message of the collective library, not RDMA data: it needs no ACK (a lost one
is repeated by the receiver's CTS timer), so it uses the unreliable transport of the same QP."""
OPCODE_NAMES[OP_UC_SEND_ONLY] = "UC_SEND_ONLY"

AETH_ACK = 0x1F
"""AETH syndrome of a positive ACK: type 000, credit count 11111 ("end-to-end credits invalid")."""
AETH_NAK_PSN_SEQUENCE_ERROR = 0x60
"""AETH syndrome of a NAK (type 011) with code 0: PSN sequence error, the go-back-N trigger."""
AETH_NAK_INVALID_REQUEST = 0x61
"""NAK code 1, invalid request: e.g. a SEND longer than the receive buffer, or a message whose
packets do not follow FIRST, MIDDLE..., LAST. The requester's QP fails."""
AETH_NAK_REMOTE_ACCESS_ERROR = 0x62
"""NAK code 2, remote access error: an RDMA WRITE outside the registered memory or with a
wrong R_Key. The requester's QP fails."""
AETH_RNR_NAK = 0x20
"""AETH type 001, receiver not ready: a SEND found no receive posted. The low 5 bits are the
RNR timer's code (IBTA table 45), how long the requester waits before it sends the packet again."""
AETH_TYPE_MASK = 0xE0
AETH_TYPE_ACK = 0x00
AETH_TYPE_NAK = 0x60
AETH_TYPE_RNR = 0x20
IMMDT_LEN = 4
CTS_MAGIC = b"CTS1"
CTS_PAYLOAD_LEN = len(CTS_MAGIC) + 8


class Aeth(NamedTuple):
    """ACK Extended Transport Header: the syndrome (ACK, NAK and its code) and the MSN."""

    syndrome: int
    msn: int

    @property
    def is_nak(self):
        return self.syndrome & AETH_TYPE_MASK == AETH_TYPE_NAK

    @property
    def is_rnr(self):
        """A receiver-not-ready NAK (type 001): not an ACK, though its type bits are not 011."""
        return self.syndrome & AETH_TYPE_MASK == AETH_TYPE_RNR


RNR_TIMER_US = (655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
                2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880,
                163840, 245760, 327680, 491520)
"""The RNR NAK timer's codes 0..31 in microseconds (IBTA table 45: code 0 is the longest)."""


def rnr_timer_s(code):
    """Seconds a requester waits after an RNR NAK whose timer field is `code`."""
    _check_range("rnr timer", code, 0, 31)
    return RNR_TIMER_US[code] * 1e-6


def rnr_timer_code(seconds):
    """The shortest RNR timer code that waits at least `seconds` (the longest, 0, if none)."""
    fits = [code for code in range(1, 32) if RNR_TIMER_US[code] * 1e-6 >= seconds]
    return min(fits, key=lambda code: RNR_TIMER_US[code]) if fits else 0


def build_aeth(syndrome, msn):
    """Pack an AETH: syndrome (8 bits) then message sequence number (24 bits)."""
    _check_range("syndrome", syndrome, 0, 0xFF)
    _check_range("msn", msn, 0, 0xFFFFFF)
    return struct.pack("!I", (syndrome << 24) | msn)


def parse_aeth(data, offset=BTH_LEN):
    if len(data) < offset + AETH_LEN:
        raise ValueError(f"an AETH needs {AETH_LEN} bytes at offset {offset}")
    word, = struct.unpack_from("!I", data, offset)
    return Aeth(word >> 24, word & 0xFFFFFF)


def build_cts_payload(granted_bytes):
    """A CTS: the cumulative number of bytes the receiver has buffer space for on a connection."""
    _check_range("granted_bytes", granted_bytes, 0, (1 << 64) - 1)
    return CTS_MAGIC + struct.pack("!Q", granted_bytes)


def parse_cts_payload(data, offset=BTH_LEN):
    """The granted byte count of a CTS, or None if the SEND is not a CTS."""
    if len(data) < offset + CTS_PAYLOAD_LEN or bytes(data[offset:offset + 4]) != CTS_MAGIC:
        return None
    return struct.unpack_from("!Q", data, offset + 4)[0]


PROBE_MAGIC = b"PRB1"
ECHO_MAGIC = b"PRE1"
_PROBE = struct.Struct("!IB")
PROBE_PAYLOAD_LEN = len(PROBE_MAGIC) + _PROBE.size
"""A plane probe (seed 002 4.3: each CC context issues RTT probes on its plane) is a UC SEND
like the CTS: the probe's sequence number and plane; the destination sends the same bytes back
as an echo, on the plane the probe came in by."""


def _build_tagged(magic, seq, name, tag):
    _check_range("seq", seq, 0, 0xFFFFFFFF)
    _check_range(name, tag, 0, 0xFF)
    return magic + _PROBE.pack(seq, tag)


def _parse_tagged(data, offset, probe_magic, echo_magic):
    if len(data) < offset + PROBE_PAYLOAD_LEN:
        return None
    magic = bytes(data[offset:offset + 4])
    if magic != probe_magic and magic != echo_magic:
        return None
    seq, tag = _PROBE.unpack_from(data, offset + 4)
    return magic == echo_magic, seq, tag


def build_probe_payload(seq, plane, echo=False):
    return _build_tagged(ECHO_MAGIC if echo else PROBE_MAGIC, seq, "plane", plane)


def parse_probe_payload(data, offset=BTH_LEN):
    """(is_echo, seq, plane) of a probe or an echo, or None if the SEND is neither."""
    return _parse_tagged(data, offset, PROBE_MAGIC, ECHO_MAGIC)


RTT_PROBE_MAGIC = b"RTT1"
RTT_ECHO_MAGIC = b"RTE1"


def build_rtt_probe_payload(seq, context, echo=False):
    """SPX CC's RTT probe (or its echo): the same layout as a plane probe under its own magic,
    `context` naming the sender's CC context (a plane index, or the QP's own)."""
    return _build_tagged(RTT_ECHO_MAGIC if echo else RTT_PROBE_MAGIC, seq, "context", context)


def parse_rtt_probe_payload(data, offset=BTH_LEN):
    """(is_echo, seq, context) of an RTT probe or its echo, or None if the SEND is neither."""
    return _parse_tagged(data, offset, RTT_PROBE_MAGIC, RTT_ECHO_MAGIC)


def build_ack_packet(src, dst, sport, dest_qp, psn, syndrome=AETH_ACK, msn=0, **ip):
    """An RC ACKNOWLEDGE (BTH + AETH): `psn` is the last PSN received in order (for a NAK, the
    PSN the requester must resend from)."""
    return build_ipv4_udp_roce_packet(src, dst, sport, OP_RC_ACKNOWLEDGE, dest_qp, psn,
                                      build_aeth(syndrome, msn), **ip)


def build_cnp_packet(src, dst, sport, dest_qp, entropy=0, **ip):
    """A RoCEv2 CNP: BTH (opcode 0x81, BECN set, PSN 0) + 16 reserved bytes, sent by a receiver
    that saw ECN CE to the QP that sent the marked packet (the DCQCN notification point).

    `entropy`: the lab puts the marked packet's UDP source port in the first two reserved bytes
    (0: none), so that an entropy-source-routing sender knows which of its entropies was marked."""
    _check_range("entropy", entropy, 0, 0xFFFF)
    padding = struct.pack("!H", entropy) + b"\x00" * (CNP_PADDING_LEN - 2)
    return build_ipv4_udp_roce_packet(src, dst, sport, OP_CNP, dest_qp, 0, padding, becn=True,
                                      **ip)


def cnp_entropy(data, offset=BTH_LEN):
    """The marked packet's source port a lab CNP echoes (0: none)."""
    if len(data) < offset + 2:
        return 0
    return struct.unpack_from("!H", data, offset)[0]


class ParsedRoce(NamedTuple):
    """What a responder or requester needs from one RoCEv2 UDP payload."""

    bth: Bth
    reth: Reth | None
    aeth: Aeth | None
    immediate: int | None
    payload_offset: int
    payload_len: int


def parse_roce(data, length=None):
    """Parse a RoCEv2 UDP payload (BTH .. ICRC) into headers and the payload's position.

    Raises ValueError for a datagram too short for the headers its opcode implies.
    """
    length = len(data) if length is None else length
    bth = parse_bth(data)
    offset = BTH_LEN
    reth = aeth = immediate = None
    if bth.opcode in RETH_OPCODES:
        reth = parse_reth(data, offset)
        offset += RETH_LEN
    if bth.opcode in AETH_OPCODES:
        aeth = parse_aeth(data, offset)
        offset += AETH_LEN
    if bth.opcode in IMMDT_OPCODES:
        if length < offset + IMMDT_LEN:
            raise ValueError("truncated immediate data")
        immediate, = struct.unpack_from("!I", data, offset)
        offset += IMMDT_LEN
    payload_len = roce_payload_length(length, bth)
    if payload_len < 0:
        raise ValueError(f"RoCEv2 datagram of {length} bytes too short for opcode {bth.opcode:#x}")
    return ParsedRoce(bth, reth, aeth, immediate, offset, payload_len)
