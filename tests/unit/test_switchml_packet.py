"""The SwitchML wire format: round trips, the byte layout, scapy's independent reading, and the
rejection of anything that is not a packet of this version."""

import struct

import numpy as np
import pytest
from scapy.compat import raw
from scapy.layers.inet import IP, UDP

from fabriclab.switchml import packet as wire
from fabriclab.switchml.layer import SwitchML
from fabriclab.switchml.packet import NO_EXPONENT, MalformedPacket, Packet, decode, encode


def vector(*values):
    return np.array(values, dtype=np.int32)


CASES = [
    Packet(job=0, worker=0, slot=0, version=0, offset=0, vector=vector()),
    Packet(job=1, worker=2, slot=3, version=1, offset=256, vector=vector(1, -1, 0, 7),
           exponent=-3, next_exponent=5),
    Packet(job=0xFFFF, worker=0xFFFF, slot=0xFFFF, version=1, offset=0xFFFFFFFF,
           vector=vector(2**31 - 1, -2**31), exponent=0x7FFF, next_exponent=NO_EXPONENT,
           result=True, retransmit=True, level=255),
    Packet(job=7, worker=1, slot=9, version=0, offset=1 << 20,
           vector=np.arange(-128, 128, dtype=np.int32), exponent=-149, next_exponent=128,
           retransmit=True, level=1),
]


@pytest.mark.parametrize("p", CASES)
def test_round_trip_keeps_every_field(p):
    data = encode(p)
    assert len(data) == wire.HEADER_LEN + 4 * p.elements == wire.wire_size(p)
    back = decode(data)
    assert back.same_as(p)
    assert back.vector.dtype == np.int32


def test_header_layout_byte_by_byte():
    p = Packet(job=0x0102, worker=0x0304, slot=0x0506, version=1, offset=0x0708090A,
               vector=vector(1, -2), exponent=-2, next_exponent=3, result=True, level=1)
    assert encode(p) == bytes([
        1,                      # protocol version
        0b011,                  # flags: version 1, result
        1, 0,                   # level, reserved
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06,   # job, worker, slot
        0x00, 0x02,             # k
        0x07, 0x08, 0x09, 0x0A,  # offset
        0xFF, 0xFE, 0x00, 0x03,  # exponent -2, look-ahead 3
        0x00, 0x00, 0x00, 0x01, 0xFF, 0xFF, 0xFF, 0xFE,   # the integers, big-endian
    ])


@pytest.mark.parametrize("p", CASES)
def test_scapy_reads_our_bytes_with_the_same_fields(p):
    frame = IP(raw(IP(src="10.0.0.1", dst="10.0.0.2")
                   / UDP(sport=40000, dport=wire.SWITCHML_UDP_PORT) / encode(p)))
    theirs = frame[SwitchML]
    assert (theirs.job, theirs.worker, theirs.slot, theirs.offset, theirs.level) == \
        (p.job, p.worker, p.slot, p.offset, p.level)
    assert (theirs.exponent, theirs.next_exponent, theirs.k) == \
        (p.exponent, p.next_exponent, p.elements)
    assert (theirs.flags.ver, theirs.flags.result, theirs.flags.retransmit) == \
        (bool(p.version), p.result, p.retransmit)
    assert theirs.vector == p.vector.tolist()


def test_scapy_built_packet_decodes_here():
    data = raw(SwitchML(job=4, worker=5, slot=6, flags="ver+retransmit", offset=64,
                        exponent=2, next_exponent=-1, vector=[3, -4, 5]))
    p = decode(data)
    assert p.same_as(Packet(job=4, worker=5, slot=6, version=1, offset=64,
                            vector=vector(3, -4, 5), exponent=2, next_exponent=-1,
                            retransmit=True))


def test_a_result_sent_from_the_aggregator_port_decodes_in_scapy():
    frame = IP(raw(IP() / UDP(sport=wire.SWITCHML_UDP_PORT, dport=50000)
                   / encode(CASES[1].replace(result=True))))
    assert frame.haslayer(SwitchML) and frame[SwitchML].flags.result


def good_bytes():
    return bytearray(encode(CASES[1]))


def with_header(**fields):
    """CASES[1]'s bytes with some header fields overwritten."""
    names = ["proto", "flags", "level", "reserved", "job", "worker", "slot", "k", "offset",
             "exponent", "next_exponent"]
    values = dict(zip(names, wire.HEADER.unpack_from(good_bytes())))
    values.update(fields)
    return wire.HEADER.pack(*(values[n] for n in names)) + bytes(good_bytes()[wire.HEADER_LEN:])


@pytest.mark.parametrize("data, reason", [
    (b"", "shorter than"),
    (bytes(good_bytes()[:wire.HEADER_LEN - 1]), "shorter than"),
    (with_header(proto=2), "protocol version 2"),
    (with_header(proto=0), "protocol version 0"),
    (with_header(flags=0x08), "unknown flag bits 0x08"),
    (with_header(reserved=1), "reserved byte"),
    (with_header(k=5), "k=5 needs 40 bytes, got 36"),
    (with_header(k=3), "k=3 needs 32 bytes, got 36"),
    (bytes(good_bytes()) + b"\x00", "got 37"),
    (bytes(good_bytes()[:-2]), "got 34"),
])
def test_malformed_packets_are_rejected_with_the_reason(data, reason):
    with pytest.raises(MalformedPacket, match=reason):
        decode(data)


def test_a_foreign_datagram_is_rejected():
    with pytest.raises(MalformedPacket):
        decode(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")


@pytest.mark.parametrize("change, field", [
    (dict(job=1 << 16), "job"), (dict(worker=-1), "worker"), (dict(slot=1 << 16), "slot"),
    (dict(offset=1 << 32), "offset"), (dict(version=2), "version"), (dict(level=256), "level"),
    (dict(exponent=NO_EXPONENT - 1), "exponent"), (dict(next_exponent=1 << 15), "next_exponent"),
])
def test_encode_refuses_a_field_that_does_not_fit(change, field):
    with pytest.raises(ValueError, match=f"field {field}="):
        encode(CASES[1].replace(**change))


def test_encode_refuses_a_vector_that_is_not_int32():
    with pytest.raises(ValueError, match="int64"):
        encode(CASES[1].replace(vector=np.array([1 << 40], dtype=np.int64)))


def test_elements_per_packet_follow_the_mtu():
    assert wire.max_elements(1500) == (1500 - 20 - 8 - 20) // 4 == 363
    assert wire.max_elements(9000) == 2238
    assert wire.max_elements(40) == 0
    assert wire.max_elements(1 << 20) == wire.MAX_ELEMENTS
    assert wire.HEADER_LEN + 4 * wire.MAX_ELEMENTS <= 65_507


def test_the_payload_is_big_endian_int32():
    data = encode(CASES[1])
    assert struct.unpack("!4i", data[wire.HEADER_LEN:]) == (1, -1, 0, 7)
