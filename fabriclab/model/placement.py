"""Where each flow goes under a routing scheme: a route is a list of (link, fraction).

- ecmp:  every switch hashes the 5-tuple (addresses, protocol, UDP ports) and picks one of its
         shortest-path next hops, as an Open vSwitch select group or a switch ASIC does. The UDP
         source port comes from the QP pair, so QP scaling adds entropy unless ports are shared.
- eecmp: Enhanced ECMP (seed 000, section 4.2.2): the hash also covers the BTH destination QP,
         so QPs of one NIC pair spread even when they share a source port.
- te:    centralized traffic engineering (seed 000, section 4.3): flows sorted by demand, largest
         first, each pinned to the shortest path with the most residual capacity (CSPF); the
         demand is what the flow would get in a non-blocking fabric (its NIC share). A flow that
         no path can carry in full still takes the widest one, and is counted as unsatisfied.
- spray: per-packet spraying, equal shares over every next hop at every switch, blind to
         failures further on (seed 002, section 2.2: "load-oblivious spraying").
- ideal: per-packet adaptive routing: at every switch the share of each next hop is
         proportional to the capacity it still has to the destination (its max-flow there), so a
         single flow gets the full leaf-pair max-flow. On a failure-free symmetric fabric it
         splits equally and is the bound; after failures it is the weighted-routing reference,
         not a global optimum (that is a linear program), and demand-aware TE can beat it.

The hash is CRC-32 of the header fields mixed with a per-switch seed (a model of a switch's hash,
not Open vSwitch's exact function): the same flow takes the same path every step, different
switches make independent choices, and the statistics are what real hashing gives.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from fabriclab.errors import LabError
from fabriclab.traffic.roce import IPPROTO_UDP, ROCEV2_UDP_PORT

SCHEMES = ("ecmp", "eecmp", "te", "spray", "ideal")
_MASK = 0xFFFFFFFF
_INF = float("inf")


@dataclass
class Placement:
    scheme: str
    routes: list              # per flow: [(link, fraction), ...] or None when unreachable
    unroutable: int = 0
    unsatisfied: int = 0      # te: flows placed on a path narrower than their demand


def place(graph, routes, flows, scheme, hash_seed=0):
    """Route every flow of a step under `scheme`, over the Routes (failures) given."""
    if scheme in ("ecmp", "eecmp"):
        placed = _hashed(graph, routes, flows, scheme == "eecmp", hash_seed)
    elif scheme in ("spray", "ideal"):
        placed = _split(graph, routes, flows, weighted=scheme == "ideal")
    elif scheme == "te":
        placed = _cspf(graph, routes, flows)
    else:
        raise LabError(f"routing must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    placed.scheme = scheme
    placed.unroutable = sum(1 for r in placed.routes if r is None)
    return placed


def _leaf(graph, port):
    return graph.port_leaf[port - graph.n_switches]


def _ends(graph, flow):
    return (graph.up_link(flow.src), 1.0), (graph.down_link(flow.dst), 1.0)


# -- hashing ----------------------------------------------------------------------------------------

def _mix(h):
    """A 32-bit avalanche (murmur3's finalizer): decorrelates the per-switch choices."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    return h ^ (h >> 16)


def switch_seeds(graph, hash_seed=0):
    return [_mix(zlib.crc32(name.encode()) ^ (hash_seed & _MASK)) for name in graph.sw_name]


def flow_hash(graph, flow, with_qp=False):
    """CRC-32 of the fields a switch hashes: the 5-tuple, plus the destination QP for E-ECMP."""
    key = struct.pack("!IIBHH", graph.port_ip[flow.src - graph.n_switches],
                      graph.port_ip[flow.dst - graph.n_switches], IPPROTO_UDP, flow.sport, ROCEV2_UDP_PORT)
    if with_qp:
        key += flow.dst_qpn.to_bytes(3, "big")
    return zlib.crc32(key)


def _per_flow(graph, flows, middle):
    """Each flow's route: its host uplink, middle(flow, src leaf, dst leaf) (None: unroutable),
    its host downlink; a flow within one leaf needs no middle."""
    out = []
    for flow in flows:
        a, b = _leaf(graph, flow.src), _leaf(graph, flow.dst)
        up, down = _ends(graph, flow)
        if a == b:
            out.append([up, down])
            continue
        hops = middle(flow, a, b)
        out.append(None if hops is None else [up, *hops, down])
    return Placement("", out)


def _hashed(graph, routes, flows, with_qp, hash_seed):
    seeds = switch_seeds(graph, hash_seed)
    dst_of = graph.link_dst

    def middle(flow, a, b):
        if not routes.reachable(a, b):
            return None
        h = flow_hash(graph, flow, with_qp)
        hops, x = [], a
        while x != b:
            opts = routes.options(x, b)
            e = opts[_mix(h ^ seeds[x]) % len(opts)]
            hops.append((e, 1.0))
            x = dst_of[e]
        return hops

    return _per_flow(graph, flows, middle)


# -- per-packet splitting -------------------------------------------------------------------------

def _split(graph, routes, flows, weighted):
    splitter = Splitter(graph, routes, weighted)
    return _per_flow(graph, flows, lambda _flow, a, b: splitter.pair(a, b))


class Splitter:
    """Per-packet shares over the shortest-path DAG: equal per next hop, or (weighted) in
    proportion to what each next hop can carry on to the destination. Shares at a switch depend
    only on the destination, so they are cached per (switch, destination leaf)."""

    def __init__(self, graph, routes, weighted):
        self.graph, self.routes, self.weighted = graph, routes, weighted
        self._hops = {}
        self._pairs = {}
        self._capacity = {}

    def capacity_to(self, x, b):
        """Capacity from switch x to leaf b over the shortest-path DAG, summed hop by hop (exact
        for the up-down DAGs of a Clos, whose paths through different next hops are disjoint)."""
        if x == b:
            return _INF
        key = (x, b)
        found = self._capacity.get(key)
        if found is None:
            found = sum(onward for _y, _members, onward in self._groups(x, b))
            self._capacity[key] = found
        return found

    def _groups(self, x, b):
        """(neighbour, its links from x, what they carry on to b): parallel members share the
        neighbour's onward capacity."""
        cap = self.graph.link_cap
        groups = {}
        for e in self.routes.options(x, b):
            groups.setdefault(self.graph.link_dst[e], []).append(e)
        return [(y, members, min(cap[members[0]] if len(members) == 1 else sum(cap[e] for e in members),
                                 self.capacity_to(y, b)))
                for y, members in groups.items()]

    def hop(self, x, b):
        """((link, next switch, share of x's traffic), ...) at switch x towards leaf b."""
        key = (x, b)
        found = self._hops.get(key)
        if found is None:
            dst_of, cap = self.graph.link_dst, self.graph.link_cap
            opts = self.routes.options(x, b)
            weights = None
            if self.weighted:
                weights = {}
                for _y, members, onward in self._groups(x, b):
                    group = sum(cap[e] for e in members)
                    for e in members:
                        weights[e] = onward * cap[e] / group
                total = sum(weights.values())
                if total <= 0:        # only reachable over dead capacity: spread evenly
                    weights = None
            if weights is None:
                found = tuple((e, dst_of[e], 1.0 / len(opts)) for e in opts)
            else:
                found = tuple((e, dst_of[e], weights[e] / total) for e in opts)
            self._hops[key] = found
        return found

    def pair(self, a, b):
        """[(link, fraction)] of traffic from leaf a to leaf b, or None if b is unreachable."""
        key = (a, b)
        if key in self._pairs:
            return self._pairs[key]
        found = None
        if self.routes.reachable(a, b):
            found = []
            hops = self._hops
            level = {a: 1.0}
            while level:              # every hop is one step closer to b: go level by level
                nxt = {}
                for x, amount in level.items():
                    if x == b:
                        continue
                    for e, y, share in hops.get((x, b)) or self.hop(x, b):
                        if share > 0:
                            part = amount * share
                            found.append((e, part))     # a link leaves one switch, at one level
                            nxt[y] = nxt.get(y, 0.0) + part
                level = nxt
        self._pairs[key] = found
        return found


# -- traffic engineering (CSPF) -------------------------------------------------------------------

def demands(graph, flows):
    """Each flow's rate in a non-blocking fabric: its sender's and receiver's fair NIC share."""
    out_count, in_count = {}, {}
    for f in flows:
        out_count[f.src] = out_count.get(f.src, 0) + 1
        in_count[f.dst] = in_count.get(f.dst, 0) + 1
    cap = graph.link_cap
    return [min(cap[graph.up_link(f.src)] / out_count[f.src], cap[graph.down_link(f.dst)] / in_count[f.dst])
            for f in flows]


def _cspf(graph, routes, flows):
    residual = list(graph.link_cap)
    dst_of = graph.link_dst
    need = demands(graph, flows)
    # Largest first; equal demands keep the step's order, so placement is deterministic.
    order = sorted(range(len(flows)), key=lambda i: -need[i])
    out = [None] * len(flows)
    unsatisfied = 0
    for i in order:
        flow = flows[i]
        a, b = _leaf(graph, flow.src), _leaf(graph, flow.dst)
        up, down = _ends(graph, flow)
        if a == b:
            out[i] = [up, down]
            continue
        if not routes.reachable(a, b):
            continue
        memo = {}

        def widest(x):
            """(width, first link) of the widest shortest path from x to b on residual capacity."""
            if x == b:
                return _INF, None
            got = memo.get(x)
            if got is None:
                got = (-_INF, None)
                for e in routes.options(x, b):
                    w = min(residual[e], widest(dst_of[e])[0])
                    if w > got[0] + 1e-9:
                        got = (w, e)
                memo[x] = got
            return got

        width = widest(a)[0]
        if width < need[i] - 1e-9:
            unsatisfied += 1
        route, x = [up], a
        while x != b:
            e = memo[x][1]
            route.append((e, 1.0))
            residual[e] -= need[i]
            x = dst_of[e]
        route.append(down)
        out[i] = route
    placed = Placement("", out)
    placed.unsatisfied = unsatisfied
    return placed


def fabric_links(route):
    """The switch-to-switch links of a route (drops the host links at either end)."""
    return [e for e, _ in route[1:-1]] if route else []

