"""Where a fabric's nodes and cables are drawn, by tier: spines on top (under a threetier
fabric's super-spines), leaves below them, hosts at the bottom; a multiplane fabric's planes side by side, each its own block of leaves and
spines. Hosts sit in one row in index order (hosts under one leaf are neighbours), spread over
the same width, so each leaf's hosts fall under it (under each plane's copy of it, roughly); under
rail cabling a rail group's hosts fall under the group's rail leaves, which are neighbours too.

Coordinates are abstract drawing units (an SVG viewBox); nothing here knows about a page.
"""

from __future__ import annotations

NODE_GAP = 60.0         # between neighbouring switches in a row
HOST_GAP = 40.0         # between neighbouring hosts
PLANE_GAP = 40.0        # extra space between two planes' blocks
ROWS = {"spine": 40.0, "leaf": 180.0, "host": 330.0}
TIER_GAP = 140.0        # a threetier fabric's super-spine row goes on top, the others move down
MARGIN = 40.0


def spread(count, width, left):
    """x of `count` nodes spread evenly over [left, left + width], each in the middle of its share."""
    step = width / max(count, 1)
    return [left + step * (i + 0.5) for i in range(count)]


def link_id(link):
    """A cable's unique name: its label for fabric links (`l1-s1#2`); a host port's interface and
    its leaf for host links (`h1-n0-l1`), since two NICs of a host may share a leaf."""
    return link.label if link.kind == "fabric" else f"{link.a_intf}-{link.b}"


def layout(fabric):
    """{"width", "height", "nodes": [{id, role, plane, x, y}], "links": [{id, label, a, b, kind,
    plane, member, rate_mbps}]} for `fabric` (a topologies.fabric.Fabric). `label` is what the
    lab's events and faults call the cable."""
    spec = fabric.spec
    roles = ("super_spine", "spine", "leaf") if spec.kind == "threetier" else ("spine", "leaf")
    rows = {role: y + (TIER_GAP if len(roles) == 3 else 0) for role, y in ROWS.items()}
    rows["super_spine"] = ROWS["spine"]
    widest = max(sum(1 for s in fabric.switches.values() if s.role == role and s.plane == 1) for role in roles)
    block = max(widest, 1) * NODE_GAP
    blocks = spec.planes * block + (spec.planes - 1) * PLANE_GAP
    hosts = sorted(fabric.hosts.values(), key=lambda h: h.index)
    width = max(blocks, len(hosts) * HOST_GAP)
    nodes = []
    for plane in range(1, spec.planes + 1):
        left = MARGIN + (width - blocks) / 2 + (plane - 1) * (block + PLANE_GAP)
        for role in roles:
            row = sorted((s for s in fabric.switches.values() if s.role == role and s.plane == plane),
                         key=lambda s: s.index)
            for switch, x in zip(row, spread(len(row), block, left)):
                nodes.append({"id": switch.name, "role": role, "plane": plane, "x": round(x, 1),
                              "y": rows[role]})
    for host, x in zip(hosts, spread(len(hosts), width, MARGIN)):
        nodes.append({"id": host.name, "role": "host", "plane": 0, "x": round(x, 1), "y": rows["host"]})
    links = [{"id": link_id(link), "label": link.label, "a": link.a, "b": link.b, "kind": link.kind,
              "plane": link.plane, "member": link.member, "rate_mbps": link.rate_mbps}
             for link in fabric.links]
    return {"width": round(width + 2 * MARGIN, 1), "height": rows["host"] + MARGIN, "nodes": nodes,
            "links": links}
