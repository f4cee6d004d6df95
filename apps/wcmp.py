"""Weights for ECMP members after permanent failures: each member's share of a destination's
traffic in proportion to the healthy capacity behind it (WCMP; seed 002 section 4.4.2's
weighted adaptive routing computes the same weights in its control plane).

Per destination leaf, switches are taken in order of their distance to it. The leaf itself can
take anything; a switch's capacity toward it is, over its next hops, the sum for each neighbour
of the smaller of the links it has to that neighbour (parallel links add up) and the
neighbour's own capacity; the neighbour's share is split over those links by their rates. On a
leaf/spine fabric that is the max flow of each path; deeper fabrics count a downstream switch's
capacity once for every upstream switch, as per-hop WCMP does.

Pure functions of a Fabric and its failed links, like paths.py; the routing classes turn the
weights into OpenFlow bucket weights and the selection stage's member weights.
"""

from __future__ import annotations

import math

from fabriclab.apps.paths import distances_to, switch_adjacency

# Weights are small integers, the largest at most 16: OVS spreads a weighted group over at most 256
# hash values, as many as the total weight over the smallest one needs (ofproto-dpif.c,
# group_setup_dp_hash_table), and 16 members x 16 stays within that.
RESOLUTION = 16


def capacities(fabric, down=frozenset()):
    """{switch: {destination leaf: {port: Mbit/s}}}: the capacity each next-hop port leads to."""
    adj = switch_adjacency(fabric, down)
    out = {name: {} for name in fabric.switches}
    for leaf in fabric.leaves():
        dist = distances_to(adj, leaf.name)
        capacity = {leaf.name: math.inf}
        for switch in sorted(dist, key=dist.get):
            if switch == leaf.name or fabric.switches[switch].plane != leaf.plane:
                continue
            by_neighbour = {}
            for neighbour, port, link in adj[switch]:
                if dist.get(neighbour) == dist[switch] - 1:
                    by_neighbour.setdefault(neighbour, []).append((port, link.rate_mbps))
            members, total = {}, 0.0
            for neighbour, links in by_neighbour.items():
                cable = sum(rate for _port, rate in links)
                share = min(cable, capacity[neighbour])
                total += share
                for port, rate in links:
                    members[port] = share * rate / cable
            capacity[switch] = total
            out[switch][leaf.name] = members
    return out


def integer_weights(shares):
    """{port: capacity} -> {port: int weight}: the smallest largest weight (up to RESOLUTION) whose
    integers come closest to the capacities' ratios (1/3 is 3:1, not 16:5), never 0."""
    if not shares:
        return {}
    top = max(shares.values())
    if not top > 0:
        return {port: 1 for port in shares}
    ratios = {port: value / top for port, value in shares.items()}

    def rounded(largest):
        return {port: max(1, round(largest * r)) for port, r in ratios.items()}

    def error(largest):
        return max(abs(w / largest - ratios[port]) for port, w in rounded(largest).items())

    best = min(range(1, RESOLUTION + 1), key=lambda largest: (round(error(largest), 9), largest))
    weights = rounded(best)
    divisor = math.gcd(*weights.values())
    return {port: w // divisor for port, w in weights.items()}


def member_weights(fabric, down=frozenset()):
    """{switch: {destination leaf: {port: weight}}} for every next-hop set (all 1s when the
    capacity behind every member is the same)."""
    return {switch: {leaf: integer_weights(shares) for leaf, shares in per_leaf.items()}
            for switch, per_leaf in capacities(fabric, down).items()}
