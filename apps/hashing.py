"""The hashes that choose among equal paths, and each switch's basis for them.

Every switch that hashes (OVS's select groups, the selection stage for E-ECMP and flowlet's first
choice) mixes its own *basis* into the hash. Real switches seed their ECMP hash per device for
one reason: switches that hash the same fields with the same basis make the same choice at every
tier. Open vSwitch's `hash` method gives a flow the bucket with the highest hash(bucket id,
basis(flow)), so a flow that won bucket k at a leaf wins bucket k again at its spine, and a
spine's cross-zone traffic all goes up one of its uplinks (ns-3's RDMA simulator had the same bug
and salted its hash with the switch id). A basis derived from the switch's dpid and the run's
seed breaks that; `shared` gives every switch one basis, the misconfiguration, kept to show it.

Pure functions, twins of the stage's C (select_stage.bpf.c: mix), shared by the controller, the
stage's loader, the flow model and the tests.
"""

from __future__ import annotations

import socket

MASK = 0xFFFFFFFF
ROCE_PORT = 4791


def mix(h, w):
    """murmur3's 32-bit finalizer after folding in one word (select_stage.bpf.c: mix)."""
    h = (h ^ w) & MASK
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK
    h ^= h >> 16
    return h


def switch_basis(dpid, seed=0, shared=False):
    """The 32-bit hash basis of the switch with `dpid` in a run seeded `seed`; with `shared`, one
    basis for every switch (the misconfiguration that polarizes)."""
    h = mix(0x6A09E667, seed & MASK)          # a fixed start: seed 0 is a basis like any other
    h = mix(h, (seed >> 32) & MASK)
    if shared:
        return h
    return mix(mix(h, dpid & MASK), (dpid >> 32) & MASK)


def _ip(address):
    """An IPv4 address as a 32-bit int (given as text or already as one)."""
    if isinstance(address, int):
        return address & MASK
    return int.from_bytes(socket.inet_aton(address), "big")


def flow_hash(src, dst, proto, sport, dport, qp=None, seed=0):
    """The stage's hash of a packet, from a switch's basis `seed`: 5-tuple, then the BTH
    destination QP when `qp` is given (E-ECMP hashes it for every RoCEv2 packet)."""
    h = seed & MASK
    for word in (_ip(src), _ip(dst), ((sport & 0xFFFF) << 16) | (dport & 0xFFFF), proto):
        h = mix(h, word)
    return mix(h, qp & 0xFFFFFF) if qp is not None else h


def eecmp_member(members, src, dst, sport, qp, seed=0, dport=ROCE_PORT, proto=17, down=()):
    """Which of `members` (in the group's order) E-ECMP sends a RoCEv2 packet to at a switch whose
    basis is `seed`: the hash's member, or the next one after it that is not in `down`."""
    start = flow_hash(src, dst, proto, sport, dport, qp, seed) % len(members)
    for i in range(len(members)):
        member = members[(start + i) % len(members)]
        if member not in down:
            return member
    return None


def ovs_group_hash(src, dst, proto, sport, dport, basis):
    """The hash an Open vSwitch `hash` select group takes of a packet, from its selection
    parameter `basis`: hash_uint64(param), then each hashed field's bytes in the fields' order
    (ofproto-dpif-xlate.c pick_hash_fields_select_group; the TCP ports of a UDP packet are left out,
    their prerequisites unmet). Bit for bit Open vSwitch's: `ovs-appctl ofproto/trace` agrees
    (tests/lab/test_fabric.py)."""
    h = ovs_hash_uint64(basis)
    for value, size in ((_ip(src), 4), (_ip(dst), 4), (proto, 1)):
        h = ovs_hash_bytes(value.to_bytes(size, "big"), h)
    if proto in (6, 17):
        for port in (sport, dport):
            h = ovs_hash_bytes((port & 0xFFFF).to_bytes(2, "big"), h)
    return h


def ovs_hash_bucket(flow_h, buckets):
    """The bucket Open vSwitch's `hash` method picks among live `buckets` [(bucket id, weight)], in
    the group's order, for a packet whose fields hashed to `flow_h`: the highest
    (hash_int(bucket id, flow_h) & 0xffff) x weight, a later bucket winning a tie
    (ofproto-dpif-xlate.c group_best_live_bucket)."""
    best, best_score = None, 0
    for bucket_id, weight in buckets:
        score = (ovs_hash_int(bucket_id, flow_h) & 0xFFFF) * weight
        if score >= best_score:
            best, best_score = bucket_id, score
    return best


def switch_bases(fabric, options):
    """{switch: its hash basis} of a fabric under a routing app's options (`seed`,
    `shared_basis`)."""
    seed, shared = options.get("seed", 0), options.get("shared_basis", False)
    return {name: switch_basis(sw.dpid, seed, shared) for name, sw in fabric.switches.items()}


# -- Open vSwitch's own hash (lib/hash.h, mhash: builds without SSE4.2), for its `hash` groups ----------
def _rot(x, k):
    return ((x << k) | (x >> (32 - k))) & MASK


def _mhash_add(h, data):
    if data:
        data = _rot((data * 0xCC9E2D51) & MASK, 15)
        h ^= (data * 0x1B873593) & MASK
    return (_rot(h, 13) * 5 + 0xE6546B64) & MASK


def _mhash_finish(h):
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK
    return h ^ (h >> 16)


def ovs_hash_bytes(data, basis):
    """lib/hash.c hash_bytes: 32-bit little-endian words, the tail zero-padded, then the length."""
    h, n = basis & MASK, len(data)
    for i in range(0, n, 4):
        h = _mhash_add(h, int.from_bytes(data[i:i + 4].ljust(4, b"\0"), "little"))
    return _mhash_finish(h ^ n)


def ovs_hash_int(x, basis):
    """hash_int(x, basis) = hash_2words(x, basis)."""
    return _mhash_finish(_mhash_add(_mhash_add(x & MASK, 0), basis & MASK) ^ 8)


def ovs_hash_uint64(x):
    return _mhash_finish(_mhash_add(_mhash_add(0, x & MASK), (x >> 32) & MASK) ^ 8)
