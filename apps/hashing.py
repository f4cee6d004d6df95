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
    """The hash an Open vSwitch `hash` select group takes of a packet's 5-tuple from its
    selection parameter `basis` (OVS: hash_uint64(param) as the basis of the fields' hash; the
    lab's own hash of them, as the fake switch's)."""
    return flow_hash(src, dst, proto, sport, dport, seed=mix(basis & MASK, (basis >> 32) & MASK))


def ovs_hash_bucket(flow_h, buckets):
    """The bucket Open vSwitch's `hash` method picks among `buckets` [(bucket id, weight)] for a
    flow whose fields hash to `flow_h` (already mixed with the group's basis): the highest
    (hash(bucket id) & 0xffff) x weight, as ofproto-dpif-xlate.c's group_best_live_bucket scores
    them (with a hash of the lab's own: the structure, not OVS's bits, decides the shares)."""
    return max(buckets, key=lambda b: ((mix(flow_h, b[0]) & 0xFFFF) * b[1], b[0]))[0]


def switch_bases(fabric, options):
    """{switch: its hash basis} of a fabric under a routing app's options (`seed`,
    `shared_basis`)."""
    seed, shared = options.get("seed", 0), options.get("shared_basis", False)
    return {name: switch_basis(sw.dpid, seed, shared) for name, sw in fabric.switches.items()}
