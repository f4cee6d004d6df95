"""Equal-cost shortest paths of a ClosGraph with some cables down: the lab's routing, at scale.

Same rule as apps/paths.py (the controller's): every switch forwards towards a destination leaf
over all its links to neighbours one hop closer, found by breadth-first search from that leaf over
the cables that are up. So after failures the model routes where the lab's controller would,
including the rare detour down through another leaf when two leaves share no live spine.

The search is level by level with set unions, which keeps a 512-leaf fabric at a few
milliseconds per destination; distances and next-hop lists are cached per destination leaf.
"""

from __future__ import annotations


class Routes:
    """Shortest-path next hops of a graph with `down` (a set of cable ids) failed."""

    def __init__(self, graph, down=frozenset()):
        self.graph = graph
        self.down = frozenset(down)
        if self.down:
            cut = {2 * c for c in self.down} | {2 * c + 1 for c in self.down}
            self.adj = []
            for nbrs in graph.adj:
                live = {}
                for y, links in nbrs.items():
                    kept = [e for e in links if e not in cut]
                    if kept:
                        live[y] = kept
                self.adj.append(live)
        else:
            self.adj = graph.adj
        self._dist = {}
        self._options = {}

    def dist(self, leaf):
        """{switch: hops to `leaf`} for the switches that can reach it."""
        found = self._dist.get(leaf)
        if found is None:
            found = {leaf: 0}
            frontier, hops = (leaf,), 0
            while frontier:
                hops += 1
                reached = set()
                for x in frontier:
                    reached.update(self.adj[x])
                reached.difference_update(found)
                for y in reached:
                    found[y] = hops
                frontier = reached
            self._dist[leaf] = found
        return found

    def options(self, switch, leaf):
        """Links out of `switch` on a shortest path to `leaf`, in link-id (port) order.

        Empty when `switch` is `leaf` or cannot reach it.
        """
        key = (switch, leaf)
        found = self._options.get(key)
        if found is None:
            dist = self.dist(leaf)
            mine = dist.get(switch)
            if not mine:
                found = ()
            elif mine == 1:               # next to the leaf: only the links into it
                found = tuple(self.adj[switch].get(leaf, ()))
            else:
                found = tuple(sorted(e for y, links in self.adj[switch].items()
                                     if dist.get(y) == mine - 1 for e in links))
            self._options[key] = found
        return found

    def reachable(self, src_leaf, dst_leaf):
        return src_leaf in self.dist(dst_leaf)
