"""Maximum flow: Dinic's algorithm on any directed graph, and leaf-pair capacity of a Clos.

Seed 002 (section 2.3, Figure 1c) measures a fabric under random link failures by the maximum
flow between every pair of leaves, as a fraction of the failure-free value. Between leaves of a
Clos, routed traffic goes up and then down (a valley-free path); a path that dips into a third
leaf is not something switches route over on purpose, so the studies here count up-down paths
only. For that case the max-flow has a closed form, because up-down paths through different
spine indices share no link:

- 2-tier, leaves a and b:  sum over spines k of min(up_a[k], up_b[k])
- 3-tier, a in pod P, b in pod Q != P:  sum over k of min(up_a[k], mid_PQ[k], up_b[k]), where
  mid_PQ[k] = sum over super-spines g of group k of min(c(s_Pk, g), c(g, s_Qk))

with up_x[k] the live capacity between leaf x and spine k of its pod. `max_flow` (Dinic) checks
the closed form in the tests and answers for anything else.
"""

from __future__ import annotations

from collections import deque

import numpy as np


def max_flow(n, edges, source, sink):
    """Value of a maximum flow from `source` to `sink`; `edges` are (u, v, capacity), 0 <= u, v < n."""
    if source == sink:
        raise ValueError("source and sink must differ")
    head = [[] for _ in range(n)]
    to, cap = [], []
    for u, v, c in edges:
        if c < 0:
            raise ValueError(f"capacity of edge {u}->{v} must be >= 0, got {c}")
        head[u].append(len(to))
        to.append(v)
        cap.append(float(c))
        head[v].append(len(to))          # residual twin: edge i's twin is i ^ 1
        to.append(u)
        cap.append(0.0)
    total = 0.0
    while True:
        level = [-1] * n
        level[source] = 0
        queue = deque([source])
        while queue:
            u = queue.popleft()
            for i in head[u]:
                if cap[i] > 1e-12 and level[to[i]] < 0:
                    level[to[i]] = level[u] + 1
                    queue.append(to[i])
        if level[sink] < 0:
            return total
        nxt = [0] * n

        def push(u, limit):
            if u == sink:
                return limit
            while nxt[u] < len(head[u]):
                i = head[u][nxt[u]]
                v = to[i]
                if cap[i] > 1e-12 and level[v] == level[u] + 1:
                    got = push(v, min(limit, cap[i]))
                    if got > 0:
                        cap[i] -= got
                        cap[i ^ 1] += got
                        return got
                nxt[u] += 1
            return 0.0

        while True:
            got = push(source, float("inf"))
            if got <= 0:
                break
            total += got


def cable_capacity(graph, down):
    """{(lower switch, upper switch): live capacity} over the switch-to-switch cables."""
    caps = {}
    for c in graph.fabric_cables():
        if c in down:
            continue
        key = (graph.link_src[2 * c], graph.link_dst[2 * c])
        caps[key] = caps.get(key, 0.0) + graph.link_cap[2 * c]
    return caps


def leaf_pair_capacity(graph, down=frozenset()):
    """Up-down max-flow of every unordered leaf pair of each plane, in a fixed pair order.

    The order depends on the graph only, so lists for two failure sets compare pair by pair.
    Each leaf's row of pairs is one numpy expression (2.1M pairs x 128 spines at 262,144
    endpoints); the spine terms are whole multiples of the link rates, so summing them in
    another order gives the same value.
    """
    p = graph.params
    caps = cable_capacity(graph, frozenset(down))
    out = []
    for plane in range(1, p.planes + 1):
        n_leaves = p.pods * p.leaves
        up = np.array([[caps.get((graph.leaf_id[plane, i + 1], graph.spine_id[plane, i // p.leaves, k]), 0.0)
                        for k in range(p.spines)] for i in range(n_leaves)], dtype=np.float64)
        mid = {}
        if p.pods > 1:
            for pa in range(p.pods):
                for pb in range(pa + 1, p.pods):
                    mid[pa, pb] = np.array([_through_group(graph, caps, plane, pa, pb, k)
                                            for k in range(p.spines)], dtype=np.float64)
        pod = np.arange(n_leaves) // p.leaves
        for a in range(n_leaves - 1):
            pa = a // p.leaves
            pair = np.minimum(up[a], up[a + 1:])
            for pb in range(pa + 1, p.pods):
                rows = pod[a + 1:] == pb
                if rows.any():
                    pair[rows] = np.minimum(pair[rows], mid[pa, pb])
            out.extend(pair.sum(axis=1).tolist())
    return out


def _through_group(graph, caps, plane, pod_a, pod_b, k):
    """Max-flow from spine k of pod_a to spine k of pod_b over super-spine group k."""
    sa, sb = graph.spine_id[plane, pod_a, k], graph.spine_id[plane, pod_b, k]
    total = 0.0
    for m in range(graph.params.superspines):
        g = graph.superspine_id[plane, k, m]
        total += min(caps.get((sa, g), 0.0), caps.get((sb, g), 0.0))
    return total


def leaf_pair_max_flow(graph, src_leaf, dst_leaf, down=frozenset(), valley_free=True):
    """Max-flow between two leaves by Dinic on the switch graph with `down` cables failed.

    valley_free=True allows only up-then-down paths (what leaf_pair_capacity computes in closed
    form): each switch appears twice, once going up and once coming down. False allows any path,
    including detours through other leaves.
    """
    s = graph.n_switches
    edges = []
    for c in graph.fabric_cables():
        if c in down:
            continue
        lower, upper, rate = graph.link_src[2 * c], graph.link_dst[2 * c], graph.link_cap[2 * c]
        if valley_free:
            edges.append((lower, upper, rate))            # going up: nodes 0..s-1
            edges.append((s + upper, s + lower, rate))    # coming down: nodes s..2s-1
        else:
            edges.append((lower, upper, rate))
            edges.append((upper, lower, rate))
    if valley_free:
        edges += [(x, s + x, float("inf")) for x in range(s)]    # turn from up to down anywhere
        return max_flow(2 * s, edges, src_leaf, s + dst_leaf)
    return max_flow(s, edges, src_leaf, dst_leaf)

