"""A routing app of one's own, in one file: each switch sends a destination leaf's traffic through
one next hop, chosen by the leaf's index (leaf k over live next hop k mod n), where ECMP hashes
flows over all of them. Destinations spread over the uplinks; one destination's flows never do.

    sudo .venv/bin/fabriclab collective --spec tiny --routing examples/routing/by_destination.py:ByDestination

It is written against the routing-as-data API the built-in apps use (docs/architecture.md): a class
built from the fabric whose desired(down) gives every switch's flow entries and groups, given the
failed links. This one composes ECMP's state and cuts each group to its chosen member, so it
inherits ECMP's failover: a failed member leaves the group and the choice moves to a live one.
"""

from fabriclab.apps.ecmp import EcmpRouting, group_ports


class ByDestination:
    def __init__(self, fabric, weighted=False):
        self.ecmp = EcmpRouting(fabric)

    def desired(self, down=frozenset()):
        states = self.ecmp.desired(down)
        for state in states.values():
            for gid, group in state.groups.items():
                ports = [port for port, _weight in group_ports(group)]
                leaf_index = gid & 0xFFFF                   # ecmp.group_id: the destination leaf's index
                state.groups[gid] = (ports[leaf_index % len(ports)],)
        return states
