"""Path pinning as data (seed 000, section 4.1.2): each destination host's traffic takes the path
its "slice" picks, with ECMP only as the fallback when that path has failed.

- A host port's **slice** is the index of its downlink among its leaf's host-facing ports, in
  port order, from 0 (`host_slices`).
- At every switch with more than one next hop toward a destination leaf (a leaf's uplinks; in a
  3-tier fabric also a spine's uplinks to its super-spines; parallel links anywhere), the members
  are the failure-free next hops in port order, and traffic to a host under that leaf goes to
  member `slice % len(members)`. Everything to one host takes one path whatever its 5-tuple: no
  hashing. So a rack whose hosts are all busy loads its uplinks evenly, and one whose job uses
  only some of its hosts loads only their slices' uplinks (the paper's fragmented placement).
- `PinRouting.desired` is ECMP's state plus one entry per (switch, destination host) at
  priority 150, above the ECMP prefixes (100) and below TE (200) and host routes (500). It points
  at a fast-failover group: the pinned port while it is live, else the destination leaf's ECMP
  group, so a local failure falls back in the data plane at once. Once the controller hears that
  the pinned member is no longer a next hop (its link, or one behind it, failed), the entry goes
  and the /24's ECMP select group, over the surviving members and hashing the 5-tuple from the
  switch's own basis, takes that host's flows: the uneven reassignment the paper saw. When the
  member is back, so is the entry, and the pin.
"""

from __future__ import annotations

from fabriclab.apps.ecmp import PRIO_PREFIX, EcmpRouting, FailoverGroup, Flow, group_id, match
from fabriclab.apps.paths import next_hops

PRIO_PIN = PRIO_PREFIX + 50       # above the ECMP prefixes, below TE (200) and host routes (500)
PIN_COOKIE = 0x50 << 56           # marks the pinning entries in flow statistics
# Fast-failover groups sit above every ECMP group id (plane << 16 | leaf index), so diff() adds
# them after, and deletes them before, the select groups they fall back to; below TE's 0x40000000.
PIN_GROUP_BASE = 0x20000000
PORT_BITS = 12                    # a spine of a 254-leaf fabric has more than 255 ports


def host_ports_by_leaf(fabric):
    """{leaf: [its host ports, in port order]}."""
    by_leaf = {}
    for host in fabric.hosts.values():
        for port in host.ports:
            by_leaf.setdefault(port.leaf, []).append(port)
    return {leaf: sorted(ports, key=lambda p: p.leaf_port) for leaf, ports in by_leaf.items()}


def host_slices(fabric):
    """{host port address: slice}: each host port's index among its leaf's host ports, in port order."""
    return {port.ip: i for ports in host_ports_by_leaf(fabric).values() for i, port in enumerate(ports)}


def pinned_port(members, slice_):
    """The member (a port, from `members` in port order) a destination of slice `slice_` is pinned to."""
    return members[slice_ % len(members)]


def pin_group_id(port, dst_leaf):
    """The fast-failover group of `port` toward `dst_leaf`: shared by every host pinned to it."""
    if not 0 < port < 1 << PORT_BITS:
        raise ValueError(f"port {port} does not fit a pinning group id ({PORT_BITS} bits)")
    return PIN_GROUP_BASE | (dst_leaf.plane << 24) | (dst_leaf.index << PORT_BITS) | port


class PinRouting(EcmpRouting):
    """ECMP plus, at every switch with a choice, an entry per destination host pinning it to the
    member its slice picks."""

    name = "pinning"

    def __init__(self, fabric, weighted=False):
        super().__init__(fabric, weighted)
        self.members = next_hops(fabric)            # failure-free: the pins do not move on a failure
        self.slices = host_slices(fabric)
        self.hosts_under = host_ports_by_leaf(fabric)

    def pins(self):
        """{switch: {host port address: pinned port}} where the switch has a choice."""
        out = {}
        for switch, per_leaf in self.members.items():
            for leaf, members in per_leaf.items():
                if len(members) < 2:
                    continue
                for port in self.hosts_under.get(leaf, ()):
                    out.setdefault(switch, {})[port.ip] = pinned_port(members, self.slices[port.ip])
        return out

    def desired(self, down=frozenset()):
        states = super().desired(down)
        live = next_hops(self.fabric, down)
        for switch, pinned in self.pins().items():
            state = states[switch]
            for ip, port in pinned.items():
                dst = self.fabric.switches[self.fabric.ip_owner[ip].leaf]
                if port not in live[switch][dst.name]:
                    continue                         # fallen back: the /24's ECMP group decides
                gid = pin_group_id(port, dst)
                state.groups[gid] = FailoverGroup(port, group_id(dst))
                state.flows.add(Flow(PRIO_PIN, match(eth_type=0x0800, ipv4_dst=ip), ("group", gid),
                                     PIN_COOKIE | (self.slices[ip] << 16) | dst.index))
        return states
