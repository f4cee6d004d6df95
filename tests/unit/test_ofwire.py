"""The OpenFlow 1.5 selection-method group property, byte for byte (no switch needed)."""

import struct

from os_ken.ofproto import ofproto_v1_5_parser as parser

from fabriclab.apps.ovs_groups import ECMP_HASH_FIELDS, NTR_VENDOR_ID, SelectionMethodProperty

# OXM basic class 0x8000: field number << 9 | length (no mask bit); values are the masks.
EXPECTED_FIELDS = {
    "ipv4_src": (11, 4), "ipv4_dst": (12, 4), "ip_proto": (10, 1),
    "udp_src": (15, 2), "udp_dst": (16, 2), "tcp_src": (13, 2), "tcp_dst": (14, 2),
}


def test_property_layout_matches_the_netronome_extension():
    raw = bytes(SelectionMethodProperty(parser).serialize())
    ptype, length, experimenter, exp_type = struct.unpack_from("!HHII", raw)
    assert (ptype, experimenter, exp_type) == (0xFFFF, NTR_VENDOR_ID, 1)
    assert len(raw) % 8 == 0 and length <= len(raw) < length + 8
    assert raw[length:] == bytes(len(raw) - length)          # padding only after the length
    assert raw[12:16] == bytes(4)
    assert raw[16:32] == b"hash".ljust(16, b"\0")
    assert raw[32:40] == bytes(8)                             # selection_method_param
    offset = 40
    for name in ECMP_HASH_FIELDS:
        header = struct.unpack_from("!I", raw, offset)[0]
        field, size = EXPECTED_FIELDS[name]
        assert header == (0x8000 << 16) | (field << 9) | size, name
        assert raw[offset + 4:offset + 4 + size] == b"\xff" * size, name
        offset += 4 + size
    assert offset == length


def test_the_hash_covers_the_udp_source_port():
    # The reason for the property: RoCEv2 flows differ only in the UDP source port.
    assert "udp_src" in ECMP_HASH_FIELDS and "ipv4_src" in ECMP_HASH_FIELDS


def test_other_methods_and_fields_encode_too():
    raw = bytes(SelectionMethodProperty(parser, method="dp_hash", fields=()).serialize())
    length = struct.unpack_from("!H", raw, 2)[0]
    assert length == 40 and raw[16:23] == b"dp_hash"
