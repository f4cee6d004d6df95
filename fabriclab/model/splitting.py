"""What every flow-model placement shares (placement.py places by scheme, optimal.py solves for the
global optimum; both build on this): the Placement a scheme returns, each flow's route as its host
uplink, a middle and its host downlink, the flows' demands in a non-blocking fabric, and the
per-packet Splitter over the shortest-path DAG with the stand-in links of its groups."""

from __future__ import annotations

from dataclasses import dataclass, field

_INF = float("inf")


@dataclass
class Placement:
    scheme: str
    routes: list              # per flow: [(link, fraction), ...] or None when unreachable
    unroutable: int = 0
    unsatisfied: int = 0      # te: flows placed on a path narrower than their demand
    # Links a route may name beyond the graph's: route link graph.n_links + i stands for the
    # links groups[i] (a numpy array), each carrying an equal share of what crosses it.
    groups: list = field(default_factory=list)


def leaf_of(graph, port):
    return graph.port_leaf[port - graph.n_switches]


def host_ends(graph, flow):
    return (graph.up_link(flow.src), 1.0), (graph.down_link(flow.dst), 1.0)


def per_flow(graph, flows, middle):
    """Each flow's route: its host uplink, middle(flow, src leaf, dst leaf) (None: unroutable),
    its host downlink; a flow within one leaf needs no middle."""
    out = []
    for flow in flows:
        a, b = leaf_of(graph, flow.src), leaf_of(graph, flow.dst)
        up, down = host_ends(graph, flow)
        if a == b:
            out.append([up, down])
            continue
        hops = middle(flow, a, b)
        out.append(None if hops is None else [up, *hops, down])
    return Placement("", out)


def demands(graph, flows):
    """Each flow's rate in a non-blocking fabric: its sender's and receiver's fair NIC share."""
    out_count, in_count = {}, {}
    for f in flows:
        out_count[f.src] = out_count.get(f.src, 0) + 1
        in_count[f.dst] = in_count.get(f.dst, 0) + 1
    cap = graph.link_cap
    return [min(cap[graph.up_link(f.src)] / out_count[f.src], cap[graph.down_link(f.dst)] / in_count[f.dst])
            for f in flows]


def group_capacity(graph, groups):
    """Capacities of a placement's stand-in links: each group's summed capacity."""
    cap = graph.arrays().link_cap
    return [float(cap[members].sum()) for members in groups]


def spread_loads(graph, groups, loads):
    """Per-link loads with each stand-in link's load shared equally by its group's members."""
    if not groups:
        return loads
    out = {e: v for e, v in loads.items() if e < graph.n_links}
    for i, members in enumerate(groups):
        load = loads.get(graph.n_links + i)
        if load:
            share = load / len(members)
            for e in members.tolist():
                out[e] = out.get(e, 0.0) + share
    return out


class Splitter:
    """Per-packet shares over the shortest-path DAG: equal per next hop, or (weighted) in
    proportion to what each next hop can carry on to the destination. Shares at a switch depend
    only on the destination, so they are cached per (switch, destination leaf)."""

    def __init__(self, graph, routes, weighted, hops=None):
        """hops: {(switch, leaf): ((link, next switch, share), ...)} decided elsewhere (the
        optimal placement's); other switches split as `weighted` says."""
        self.graph, self.routes, self.weighted = graph, routes, weighted
        self._hops = dict(hops or {})
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
