"""ECMP routing as data: the flow entries and select groups each switch should hold.

`EcmpRouting.desired()` maps (fabric, failed links) to the intended state of every switch, and
`diff()` turns an old and a new state into the minimal changes, so the os-ken adapter only
translates and sends. Group buckets watch their output port, so Open vSwitch skips a dead local
member at once (the data-plane fast failover), before the controller's recompute removes remote
failures too. With `weighted`, a group whose members lead to unequal healthy capacity (a
remote permanent failure behind one of them, wcmp.py) becomes a WeightedGroup.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fabriclab.apps.paths import next_hops
from fabriclab.apps.wcmp import member_weights

PRIO_ARP = 1000
PRIO_HOST = 500
PRIO_PREFIX = 100


@dataclass(frozen=True)
class Flow:
    priority: int
    match: tuple          # sorted (field, value) pairs, OpenFlow 1.3 OXM names
    action: tuple         # ('output', port) | ('group', id) | ('controller',)
    cookie: int = 0       # lets an app find its entries in flow statistics

    @property
    def match_dict(self):
        return dict(self.match)


@dataclass(frozen=True)
class FailoverGroup:
    """A fast-failover group: out of `port` while it is live, else on to group `backup`."""
    port: int
    backup: int


@dataclass(frozen=True)
class WeightedGroup:
    """A select group whose members take shares of the flows in proportion to their weights."""
    ports: tuple
    weights: tuple


def group_ports(group):
    """The (port, weight) members of a select group (a tuple of ports or a WeightedGroup)."""
    if isinstance(group, WeightedGroup):
        return tuple(zip(group.ports, group.weights))
    return tuple((port, 1) for port in group)


@dataclass
class SwitchState:
    flows: set = field(default_factory=set)
    groups: dict = field(default_factory=dict)    # group id -> ports (select) | WeightedGroup | FailoverGroup


def group_id(leaf):
    """One select group per destination leaf: plane in the high half, leaf index in the low."""
    return (leaf.plane << 16) | leaf.index


def match(**fields):
    return tuple(sorted(fields.items()))


class EcmpRouting:
    """Destination-prefix routing with one select group (hashing the 5-tuple) per remote leaf;
    `weighted`: members weighted by the healthy capacity behind them."""

    name = "ecmp"

    def __init__(self, fabric, weighted=False):
        self.fabric = fabric
        self.weighted = weighted

    def desired(self, down=frozenset()):
        hops = next_hops(self.fabric, down)
        weights = member_weights(self.fabric, down) if self.weighted else {}
        states = {}
        for switch in self.fabric.switches.values():
            state = SwitchState()
            if switch.role == "leaf":
                state.flows.add(Flow(PRIO_ARP, match(eth_type=0x0806), ("controller",)))
                for port in self._host_ports(switch.name):
                    state.flows.add(Flow(PRIO_HOST, match(eth_type=0x0800, ipv4_dst=port.ip),
                                         ("output", port.leaf_port)))
            for leaf_name, ports in hops[switch.name].items():
                leaf = self.fabric.switches[leaf_name]
                gid = group_id(leaf)
                state.groups[gid] = self._group(ports, weights.get(switch.name, {}).get(leaf_name, {}))
                net = f"10.{leaf.plane}.{leaf.index}.0"
                state.flows.add(Flow(PRIO_PREFIX,
                                     match(eth_type=0x0800, ipv4_dst=(net, "255.255.255.0")),
                                     ("group", gid)))
            states[switch.name] = state
        return states

    @staticmethod
    def _group(ports, weights):
        chosen = tuple(weights.get(port, 1) for port in ports)
        if len(set(chosen)) > 1:
            return WeightedGroup(tuple(ports), chosen)
        return tuple(ports)

    def _host_ports(self, leaf):
        return [p for host in self.fabric.hosts.values() for p in host.ports if p.leaf == leaf]


def diff(old: SwitchState | None, new: SwitchState):
    """Changes that take a switch from `old` (None: unknown, so wipe) to `new`, in a safe order.

    Groups are added before the flows that point at them and deleted after those flows are gone;
    failover groups have the higher ids, so they are added after and deleted before the select
    groups they fall back to.
    """
    ops = []
    if old is None:
        ops.append(("reset",))
        old = SwitchState()
    for gid, ports in sorted(new.groups.items()):
        if gid not in old.groups:
            ops.append(("group_add", gid, ports))
        elif old.groups[gid] != ports:
            ops.append(("group_mod", gid, ports))
    for flow in sorted(old.flows - new.flows, key=repr):
        ops.append(("flow_del", flow))
    for flow in sorted(new.flows - old.flows, key=repr):
        ops.append(("flow_add", flow))
    for gid in sorted(set(old.groups) - set(new.groups), reverse=True):
        ops.append(("group_del", gid))
    return ops
