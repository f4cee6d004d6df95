"""Open vSwitch's select-group extension: choosing which fields the bucket hash covers.

OpenFlow leaves a select group's bucket choice to the switch. Open vSwitch lets a controller set
it with a Netronome experimenter property on OpenFlow 1.5 group mods; without it OVS uses a
symmetric L3/L4 dp_hash that leaves UDP ports out, so every RoCEv2 QP between two NICs (same
addresses, same destination port 4791, only the source port differs) would take the same path.
"""

import struct

# Select groups hash these fields (OXM names): the 5-tuple. Open vSwitch's default select method
# hashes only addresses for UDP, which would put every RoCEv2 QP of a host pair on one path.
ECMP_HASH_FIELDS = ("ipv4_src", "ipv4_dst", "ip_proto", "udp_src", "udp_dst", "tcp_src", "tcp_dst")
# Weighted groups use OVS's dp_hash method instead: with `hash`, OVS gives the packet to the live
# bucket with the highest (hash(bucket, fields) & 0xffff) * weight (ofproto-dpif-xlate.c,
# group_best_live_bucket), which is not proportional (weights 1,1,2,2 give 6/6/44/44 %, not
# 17/17/33/33 %). dp_hash maps up to 256 hash values onto the buckets by weight (Webster's method,
# ofproto-dpif.c group_setup_dp_hash_table); its parameter's high half is the hash algorithm,
# OVS_HASH_ALG_L4 (0): the userspace datapath hashes the 5-tuple, UDP ports included
# (miniflow_hash_5tuple). It takes no field list.
DP_HASH_L4 = 0
NTR_VENDOR_ID = 0x0000154D      # the Netronome group extension Open vSwitch implements
NTRT_SELECTION_METHOD = 1


class SelectionMethodProperty:
    """The OpenFlow 1.5 group property that sets Open vSwitch's bucket selection (Netronome ext.).

    Wire layout: type 0xffff, length, experimenter, exp_type, 4 pad bytes, the method name in 16
    bytes, a 64-bit parameter, then each hash field as an OXM TLV whose value is its mask (all
    ones: the whole field is hashed); the length excludes the padding to 8 bytes. Written here
    because os-ken's experimenter properties carry only 32-bit words, and these TLVs are not.
    """

    def __init__(self, parser, method="hash", fields=ECMP_HASH_FIELDS, param=0):
        self.method = method
        self.fields = fields
        self.param = param
        body = bytes(4) + method.encode().ljust(16, b"\0") + struct.pack("!Q", param)
        for name in fields:
            header = bytes(parser.OFPOxmId(type_=name).serialize())
            body += header + b"\xff" * header[3]      # the OXM header's last byte is the length
        self.body = body

    def serialize(self):
        length = 12 + len(self.body)
        raw = struct.pack("!HHII", 0xFFFF, length, NTR_VENDOR_ID, NTRT_SELECTION_METHOD) + self.body
        return bytearray(raw + bytes(-length % 8))


def hash_selection(parser, basis=0):
    """The selection method of an unweighted group: `hash` over the 5-tuple from the switch's
    `basis` (OVS: basis = hash_uint64(selection_method_param); apps/hashing.py says why each
    switch needs its own)."""
    return SelectionMethodProperty(parser, param=basis & 0xFFFFFFFF)


def weighted_selection(parser, basis=0):
    """The selection method of a weighted group: dp_hash over the 5-tuple (see DP_HASH_L4), its
    parameter's low half the switch's hash basis."""
    return SelectionMethodProperty(parser, method="dp_hash", fields=(), param=(DP_HASH_L4 << 32) | (basis & 0xFFFFFFFF))
