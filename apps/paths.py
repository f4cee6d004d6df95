"""Equal-cost shortest paths over the fabric graph, for whatever links are up.

Pure functions of a Fabric and a set of failed links, shared by the controller apps (which turn
next hops into OpenFlow groups) and the CLI (which shows paths). Routing is per destination leaf:
every host port under a leaf is in the leaf's /24, so a switch needs one next-hop set per leaf.
Nothing assumes two tiers: a breadth-first search from each destination leaf works for any depth.
"""

from __future__ import annotations

from collections import deque


def switch_adjacency(fabric, down=frozenset()):
    """switch -> list of (neighbour switch, local port, link) over the fabric links that are up.

    `down` holds Link.key tuples of failed links.
    """
    adj = {name: [] for name in fabric.switches}
    for link in fabric.fabric_links:
        if link.key in down:
            continue
        adj[link.a].append((link.b, link.a_port, link))
        adj[link.b].append((link.a, link.b_port, link))
    return adj


def distances_to(adj, target):
    """Hop count from every switch to `target` (switches that cannot reach it are absent)."""
    dist = {target: 0}
    queue = deque([target])
    while queue:
        node = queue.popleft()
        for neighbour, _port, _link in adj[node]:
            if neighbour not in dist:
                dist[neighbour] = dist[node] + 1
                queue.append(neighbour)
    return dist


def next_hops(fabric, down=frozenset()):
    """{switch: {destination leaf: sorted list of output ports on a shortest path}}.

    A switch with no path to a leaf maps it to an empty list (traffic there is dropped, not looped).
    A leaf does not list itself: its own hosts are reached through host routes.
    """
    adj = switch_adjacency(fabric, down)
    table = {name: {} for name in fabric.switches}
    for leaf in fabric.leaves():
        dist = distances_to(adj, leaf.name)
        for switch in fabric.switches.values():
            if switch.name == leaf.name or switch.plane != leaf.plane:
                continue
            mine = dist.get(switch.name)
            ports = [] if mine is None else sorted(
                port for neighbour, port, _link in adj[switch.name]
                if dist.get(neighbour) == mine - 1)
            table[switch.name][leaf.name] = ports
    return table


def all_paths(fabric, src_leaf, dst_leaf, down=frozenset()):
    """Every shortest switch path from src_leaf to dst_leaf, as lists of Links in order.

    Parallel links between the same two switches are distinct paths, as they are for ECMP.
    """
    if src_leaf == dst_leaf:
        return [[]]
    adj = switch_adjacency(fabric, down)
    dist = distances_to(adj, dst_leaf)
    if src_leaf not in dist:
        return []
    paths = []

    def extend(node, hops):
        if node == dst_leaf:
            paths.append(list(hops))
            return
        for neighbour, _port, link in sorted(adj[node], key=lambda item: (item[0], item[1])):
            if dist.get(neighbour) == dist[node] - 1:
                hops.append(link)
                extend(neighbour, hops)
                hops.pop()

    extend(src_leaf, [])
    return paths


def path_nodes(path, start):
    """The switches a path (list of Links from all_paths) visits, starting at `start`."""
    nodes = [start]
    for link in path:
        nodes.append(link.b if link.a == nodes[-1] else link.a)
    return nodes


def ar_groups(fabric, down_intfs=frozenset()):
    """{(switch, destination /24 network): sorted member interfaces} for every destination a
    switch reaches over two or more shortest-path next hops: the ports adaptive routing could
    choose among for a packet there (the members the routing apps' select groups hold), leaving
    out the interfaces in `down_intfs` (cables that are down: adaptive routing excludes a failed
    link). The network is the destination leaf's /24 (every host port under a leaf is in it), an
    integer in host order. The queue model's "ar" ECN mode marks by these groups."""
    nets = {}
    for host in fabric.hosts.values():
        for port in host.ports:
            a, b, c, _d = (int(x) for x in port.ip.split("."))
            nets.setdefault(port.leaf, set()).add((a << 24) | (b << 16) | (c << 8))
    out = {}
    for switch, by_leaf in next_hops(fabric).items():
        names = fabric.switch_ports(switch)
        for leaf, ports in by_leaf.items():
            members = sorted(names[port] for port in ports if names[port] not in down_intfs)
            if len(members) < 2:
                continue
            for net in sorted(nets.get(leaf, ())):
                out[(switch, net)] = members
    return out
