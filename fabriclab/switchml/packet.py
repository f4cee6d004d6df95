"""The SwitchML wire format: one UDP datagram per slot update or result (seed 003, section 4).

A packet carries a fixed 20-byte header and then k signed 32-bit integers in network byte order::

    offset size  field
     0     1     protocol version (1)
     1     1     flags: bit 0 pool version (the slot's copy, 0 or 1), bit 1 result (set on what an
                 aggregator sends down, clear on an update going up), bit 2 retransmission
                 (informational: set on a resend, so counters and captures can tell them apart)
     2     1     level: the tier of the sender (0 a worker, 1 the aggregator beside a ToR, 2 the one
                 at a spine); an update from level 1 is a rack's partial aggregate
     3     1     reserved, 0
     4     2     job id (each job has its own pool at an aggregator)
     6     2     worker id: the sender's bit in the receiving aggregator's seen bitmap (a leaf
                 aggregator's index at its parent when it forwards a partial)
     8     2     slot: the pool index
    10     2     k: how many integers follow
    12     4     offset: the tensor element the first integer belongs to
    16     2     exponent (signed): the shared block exponent the integers are scaled with
    18     2     look-ahead exponent (signed): the sender's exponent for the slot's next block; a
                 result carries the maximum over every contribution
    20     4k    the integers

Exponents are 16 bits because float32 exponents span -149..128; NO_EXPONENT marks "none" (int32
tensors, a slot's last block) and is the identity of max(), so aggregators need no special case.

The aggregator never reads the offset (algorithm 3 tracks a slot by its index and version only);
it rides along so a result says where it goes, and so a worker can tell a stale result for an
older use of the same slot and version from the one it waits for.
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np

SWITCHML_UDP_PORT = 27182
"""Workers and aggregators send to and listen on this port. It is below Linux's ephemeral range
(32768-60999) and far from RoCE's 4791 and its 0xC000+ source ports, so no other socket of the
lab picks it by chance, and OpenFlow rules can steer aggregation traffic by it alone."""

PROTOCOL_VERSION = 1
HEADER = struct.Struct("!BBBBHHHHIhh")
HEADER_LEN = HEADER.size
ELEMENT = np.dtype(">i4")
ELEMENT_LEN = ELEMENT.itemsize

FLAG_VERSION = 0x01
FLAG_RESULT = 0x02
FLAG_RETRANSMIT = 0x04
KNOWN_FLAGS = FLAG_VERSION | FLAG_RESULT | FLAG_RETRANSMIT

NO_EXPONENT = -(1 << 15)
"""No exponent: the smallest int16, so max() over contributions ignores it."""
MAX_EXPONENT = (1 << 15) - 1

IPV4_UDP_OVERHEAD = 20 + 8
MAX_UDP_PAYLOAD = 65_507
MAX_ELEMENTS = (MAX_UDP_PAYLOAD - HEADER_LEN) // ELEMENT_LEN
"""The most integers one IPv4 UDP datagram can carry; the MTU usually allows far fewer."""

U8, U16, U32 = (1 << 8) - 1, (1 << 16) - 1, (1 << 32) - 1


class MalformedPacket(ValueError):
    """Bytes that are not a SwitchML packet of this version; receivers count and drop them."""


@dataclasses.dataclass(frozen=True, eq=False)
class Packet:
    """A decoded SwitchML packet. `vector` is a native-endian int32 array of k elements."""

    job: int
    worker: int
    slot: int
    version: int
    offset: int
    vector: np.ndarray
    exponent: int = NO_EXPONENT
    next_exponent: int = NO_EXPONENT
    result: bool = False
    retransmit: bool = False
    level: int = 0

    @property
    def elements(self) -> int:
        return len(self.vector)

    def replace(self, **changes) -> Packet:
        return dataclasses.replace(self, **changes)

    def same_as(self, other: Packet) -> bool:
        """Field-by-field equality with the vector compared by value (dataclass == cannot)."""
        return all(np.array_equal(getattr(self, f.name), getattr(other, f.name))
                   if f.name == "vector" else getattr(self, f.name) == getattr(other, f.name)
                   for f in dataclasses.fields(self))


def max_elements(mtu: int) -> int:
    """How many integers fit in one IPv4 packet of this MTU (1500 -> 363)."""
    return max(0, min(MAX_ELEMENTS, (mtu - IPV4_UDP_OVERHEAD - HEADER_LEN) // ELEMENT_LEN))


def wire_size(packet: Packet) -> int:
    """Bytes of the UDP payload: what a worker's "bytes sent" counts."""
    return HEADER_LEN + ELEMENT_LEN * packet.elements


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ValueError(f"SwitchML packet field {name}={value} is outside {low}..{high}")


def encode(packet: Packet) -> bytes:
    """The packet's bytes; a field that does not fit its width is a ValueError naming it."""
    for name, high in (("job", U16), ("worker", U16), ("slot", U16), ("offset", U32),
                       ("level", U8), ("version", 1)):
        _check_range(name, getattr(packet, name), 0, high)
    for name in ("exponent", "next_exponent"):
        _check_range(name, getattr(packet, name), NO_EXPONENT, MAX_EXPONENT)
    _check_range("k", packet.elements, 0, MAX_ELEMENTS)
    flags = (FLAG_VERSION * packet.version) | (FLAG_RESULT * packet.result) \
        | (FLAG_RETRANSMIT * packet.retransmit)
    header = HEADER.pack(PROTOCOL_VERSION, flags, packet.level, 0, packet.job, packet.worker,
                         packet.slot, packet.elements, packet.offset, packet.exponent,
                         packet.next_exponent)
    # astype to a big-endian dtype refuses nothing: an int64 outside int32 would wrap silently.
    vector = np.asarray(packet.vector)
    if vector.dtype != np.int32:
        raise ValueError(f"SwitchML packet vector must be int32, not {vector.dtype}")
    return header + vector.astype(ELEMENT).tobytes()


def decode(data: bytes) -> Packet:
    """A packet from a datagram's payload; anything else raises MalformedPacket with the reason."""
    if len(data) < HEADER_LEN:
        raise MalformedPacket(f"{len(data)} bytes is shorter than the {HEADER_LEN}-byte header")
    (proto, flags, level, reserved, job, worker, slot, k, offset, exponent,
     next_exponent) = HEADER.unpack_from(data)
    if proto != PROTOCOL_VERSION:
        raise MalformedPacket(f"protocol version {proto}, expected {PROTOCOL_VERSION}")
    if flags & ~KNOWN_FLAGS:
        raise MalformedPacket(f"unknown flag bits {flags & ~KNOWN_FLAGS:#04x}")
    if reserved:
        raise MalformedPacket(f"reserved byte is {reserved}, expected 0")
    if len(data) != HEADER_LEN + ELEMENT_LEN * k:
        raise MalformedPacket(f"k={k} needs {HEADER_LEN + ELEMENT_LEN * k} bytes, got {len(data)}")
    vector = np.frombuffer(data, dtype=ELEMENT, offset=HEADER_LEN).astype(np.int32)
    return Packet(job=job, worker=worker, slot=slot, version=flags & FLAG_VERSION, offset=offset,
                  vector=vector, exponent=exponent, next_exponent=next_exponent,
                  result=bool(flags & FLAG_RESULT), retransmit=bool(flags & FLAG_RETRANSMIT),
                  level=level)
