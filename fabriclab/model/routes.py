"""Equal-cost shortest paths of a ClosGraph with some cables down: the lab's routing, at scale.

Same rule as apps/paths.py (the controller's): every switch forwards towards a destination leaf
over all its links to neighbours one hop closer, found by breadth-first search from that leaf over
the cables that are up. So after failures the model routes where the lab's controller would,
including the rare detour down through another leaf when two leaves share no live spine.

Distances from every leaf come from one breadth-first search per leaf in scipy's compiled
csgraph, kept as a small-integer row per leaf (-1: unreachable): a Python search level by level
took 2048 x 0.5M set operations at 262,144 endpoints. Next-hop lists are cached per
(switch, destination leaf), and equal lists are stored once (a leaf's uplinks are its next hops
towards almost every other leaf).
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path


class Routes:
    """Shortest-path next hops of a graph with `down` (a set of cable ids) failed."""

    def __init__(self, graph, down=frozenset()):
        self.graph = graph
        self.down = frozenset(down)
        arrays = graph.arrays()
        self.live = np.ones(graph.n_links, dtype=bool)
        if self.down:
            cut = np.fromiter(self.down, dtype=np.int64, count=len(self.down))
            self.live[2 * cut] = False
            self.live[2 * cut + 1] = False
        self._out_start, self._out_links = arrays.out_start, arrays.out_links
        self._link_dst = arrays.link_dst
        self._dist = None
        self._row = {leaf: i for i, leaf in enumerate(graph.leaves)}
        self._options = {}
        self._arrays = {}
        self._interned = {}
        self._outs = {}

    def _distances(self):
        """Hops from every leaf to every switch (int16, -1 where unreachable), plane by plane."""
        g = self.graph
        n = g.n_switches
        first = 2 * g.n_ports
        src = np.asarray(g.link_src[first:], dtype=np.int64)
        dst = np.asarray(g.link_dst[first:], dtype=np.int64)
        keep = self.live[first:]
        adj = csr_matrix((np.ones(int(keep.sum()), dtype=np.int8), (src[keep], dst[keep])), shape=(n, n))
        table = np.full((len(self._row), n), -1, dtype=np.int16)
        planes = np.asarray(g.sw_plane)
        leaves = np.asarray(g.leaves, dtype=np.int64)
        for plane in sorted(set(g.sw_plane)):
            block = np.flatnonzero(planes == plane)         # a plane's switches are contiguous
            lo, hi = int(block[0]), int(block[-1]) + 1
            sub = adj[lo:hi, lo:hi]
            rows = np.flatnonzero((leaves >= lo) & (leaves < hi))
            found = shortest_path(sub, directed=True, unweighted=True, indices=leaves[rows] - lo)
            found = np.atleast_2d(found)
            hops = np.where(np.isfinite(found), found, -1).astype(np.int16)
            table[rows, lo:hi] = hops
        return table

    def dist(self, leaf):
        """Hops from every switch to `leaf` (an array indexed by switch id; -1: cannot reach it)."""
        if self._dist is None:
            self._dist = self._distances()
        return self._dist[self._row[leaf]]

    def options(self, switch, leaf):
        """Links out of `switch` on a shortest path to `leaf`, in link-id (port) order.

        Empty when `switch` is `leaf` or cannot reach it.
        """
        key = (switch, leaf)
        found = self._options.get(key)
        if found is None:
            links = self.options_array(switch, leaf)
            if links is self._out(switch):          # every link out is a next hop: share one tuple
                found = self._interned.get(switch)
                if found is None:
                    found = self._interned[switch] = tuple(links.tolist())
            else:
                found = tuple(links.tolist())
            self._options[key] = found
        return found

    def _out(self, switch):
        """The switch's outgoing switch-to-switch links that are up (one shared array each)."""
        found = self._outs.get(switch)
        if found is None:
            links = self._out_links[self._out_start[switch]:self._out_start[switch + 1]]
            found = self._outs[switch] = links if self.live[links].all() else links[self.live[links]]
        return found

    def options_array(self, switch, leaf):
        """options() as a numpy array of link ids."""
        key = (switch, leaf)
        found = self._arrays.get(key)
        if found is None:
            dist = self.dist(leaf)
            mine = dist[switch]
            links = self._out(switch)
            if mine <= 0:
                found = links[:0]
            elif mine == 1:                  # next to the leaf: only the links into it
                found = np.array([e for e in self.graph.adj[switch].get(leaf, ()) if self.live[e]],
                                 dtype=links.dtype)
            else:
                keep = dist[self._link_dst[links]] == mine - 1
                found = links if keep.all() else links[keep]
            self._arrays[key] = found
        return found

    def reachable(self, src_leaf, dst_leaf):
        return bool(self.dist(dst_leaf)[src_leaf] >= 0)
