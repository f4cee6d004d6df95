"""Centralized traffic engineering as data (seed 000, section 4.3): demands, CSPF, and the switch
state that puts the placement above the ECMP defaults.

- A demand is a <source port, destination prefix> pair at a leaf: the leaf port a host NIC is
  cabled to, and a remote leaf's /24. Its rate comes from the job placement the traffic launcher
  announces (a NIC sends at line rate, shared among its destinations in proportion to the bytes
  the schedule sends each) or, for traffic no job announced, from the switch's flow counters.
- `cspf` places demands, largest first, on the shortest path with the most free capacity that
  still fits the demand; ties go to the path whose links were measured least loaded. A demand no
  path can carry stays on ECMP and is reported unplaced.
- `TeRouting.desired` is ECMP's state plus, at each leaf, one entry per <in_port, destination
  /24> (they also count the bytes the traffic matrix needs). A placed entry points at a fast-
  failover group: its uplink while that port is live, else the ECMP group, so a local failure
  falls back in the data plane at once; an entry whose path crosses a failed link is dropped
  back to ECMP as soon as the controller hears of it, and the next recompute places it again.

TE pins the first hop, as the paper's entries at the rack switches do; beyond it ECMP decides.
In a 2-tier fabric without parallel links the first hop fixes the whole path; in a 3-tier one
the first hop fixes the spine, and ECMP picks among the super-spines of its group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fabriclab.apps.ecmp import PRIO_PREFIX, EcmpRouting, FailoverGroup, Flow, group_id, match
from fabriclab.apps.paths import all_paths, path_nodes

PRIO_TE = PRIO_PREFIX + 100   # above the ECMP prefixes, below host routes (500)
TE_COOKIE = 0x7E << 56        # marks the TE entries (flow statistics ask for these only)
TE_COOKIE_MASK = 0xFF << 56
FF_GROUP_BASE = 0x40000000    # fast-failover groups sit above every ECMP group id


@dataclass(frozen=True)
class DemandKey:
    leaf: str
    in_port: int             # the leaf port of the source NIC
    dst_leaf: str


@dataclass
class Demand:
    key: DemandKey
    mbps: float
    source: str              # "job:<name>" or "measured"
    host_port: str = ""      # the source NIC's interface, for people reading the placement


@dataclass
class Placement:
    placed: dict = field(default_factory=dict)      # DemandKey -> Route
    unplaced: list = field(default_factory=list)    # (Demand, reason)
    allocated: dict = field(default_factory=dict)   # (link key, from node) -> Mbit/s

    def to_dict(self, fabric, demands):
        by_key = {d.key: d for d in demands}
        rows = []
        for key, route in sorted(self.placed.items(), key=lambda kv: _key_order(kv[0])):
            d = by_key.get(key)
            rows.append({"leaf": key.leaf, "in_port": key.in_port, "dst_leaf": key.dst_leaf,
                         "dst_prefix": prefix_of(fabric, key.dst_leaf),
                         "host_port": d.host_port if d else "", "mbps": round(d.mbps, 3) if d else None,
                         "source": d.source if d else None, "uplink": route.port,
                         "uplink_intf": fabric.switch_ports(key.leaf).get(route.port),
                         "path": route.nodes, "free_after_mbps": round(route.free_after, 3)})
        unplaced = [{"leaf": d.key.leaf, "in_port": d.key.in_port, "dst_leaf": d.key.dst_leaf,
                     "host_port": d.host_port, "mbps": round(d.mbps, 3), "source": d.source,
                     "reason": reason} for d, reason in self.unplaced]
        links = [{"link": "-".join(map(str, k[0])), "from": k[1], "allocated_mbps": round(v, 3)}
                 for k, v in sorted(self.allocated.items(), key=lambda kv: repr(kv[0]))]
        return {"placed": rows, "unplaced": unplaced, "links": links}


@dataclass(frozen=True)
class Route:
    port: int                # the leaf's output port (first hop)
    links: tuple             # Link.key of every link on the path
    nodes: tuple             # switch names along it
    free_after: float        # the path's tightest free capacity once this demand is on it


def _key_order(key):
    return (key.leaf, key.in_port, key.dst_leaf)


def prefix_of(fabric, leaf_name):
    leaf = fabric.switches[leaf_name]
    return f"10.{leaf.plane}.{leaf.index}.0/24"


def capacities(fabric, max_utilization=1.0):
    """(link key, from node) -> Mbit/s CSPF may allocate in that direction."""
    out = {}
    for link in fabric.fabric_links:
        for node in (link.a, link.b):
            out[(link.key, node)] = link.rate_mbps * max_utilization
    return out


def cspf(fabric, demands, down=frozenset(), max_utilization=1.0, measured=None):
    """Place `demands` (list of Demand); `measured` maps (link key, from node) to the Mbit/s the
    switches last counted there (used only to break ties). Returns a Placement."""
    measured = measured or {}
    free = capacities(fabric, max_utilization)
    result = Placement()
    for demand in sorted(demands, key=lambda d: (-d.mbps, _key_order(d.key))):
        best, best_score = None, None
        for path in all_paths(fabric, demand.key.leaf, demand.key.dst_leaf, down):
            nodes = path_nodes(path, demand.key.leaf)
            hops = [(link.key, nodes[i]) for i, link in enumerate(path)]
            if not hops:
                continue
            room = min(free[h] for h in hops)
            if room + 1e-9 < demand.mbps:
                continue
            busiest = max(measured.get(h, 0.0) for h in hops)
            score = (round(room, 6), -round(busiest, 6))
            if best is None or score > best_score:
                first = path[0]
                port = first.a_port if first.a == demand.key.leaf else first.b_port
                best, best_score = (port, path, nodes, hops), score
        if best is None:
            paths = all_paths(fabric, demand.key.leaf, demand.key.dst_leaf, down)
            reason = ("no path (failed links)" if not paths else
                      f"no path with {demand.mbps:.2f} Mbit/s free")
            result.unplaced.append((demand, reason))
            continue
        port, path, nodes, hops = best
        for h in hops:
            free[h] -= demand.mbps
            result.allocated[h] = result.allocated.get(h, 0.0) + demand.mbps
        result.placed[demand.key] = Route(port, tuple(link.key for link in path), tuple(nodes),
                                          min(free[h] for h in hops))
    return result


def te_cookie(in_port, dst_leaf):
    return TE_COOKIE | (in_port << 16) | dst_leaf.index


def failover_group_id(port, dst_leaf):
    return FF_GROUP_BASE | (dst_leaf.plane << 24) | (dst_leaf.index << 8) | port


def demand_keys(fabric):
    """Every <in_port, remote leaf> pair a leaf has a TE entry for: {DemandKey: host port}."""
    keys = {}
    for host in fabric.hosts.values():
        for port in host.ports:
            for leaf in fabric.leaves():
                if leaf.name != port.leaf and leaf.plane == port.plane:
                    keys[DemandKey(port.leaf, port.leaf_port, leaf.name)] = port
    return keys


class TeRouting(EcmpRouting):
    """ECMP plus a TE entry per <source port, destination prefix> at each leaf."""

    name = "te"

    def __init__(self, fabric, weighted=False):
        super().__init__(fabric, weighted)
        self.placement = Placement()
        self.keys = demand_keys(fabric)

    def active_routes(self, down=frozenset()):
        """The placed routes none of whose links is down."""
        return {key: route for key, route in self.placement.placed.items()
                if not any(link in down for link in route.links)}

    def desired(self, down=frozenset()):
        states = super().desired(down)
        routes = self.active_routes(down)
        for key in self.keys:
            state = states[key.leaf]
            dst = self.fabric.switches[key.dst_leaf]
            ecmp = group_id(dst)
            route = routes.get(key)
            if route is not None:
                gid = failover_group_id(route.port, dst)
                state.groups[gid] = FailoverGroup(route.port, ecmp)
                action = ("group", gid)
            else:
                action = ("group", ecmp)
            state.flows.add(Flow(PRIO_TE, match(in_port=key.in_port, eth_type=0x0800,
                                                ipv4_dst=(f"10.{dst.plane}.{dst.index}.0", "255.255.255.0")),
                                 action, te_cookie(key.in_port, dst)))
        return states


def job_demands(fabric, jobs):
    """Demands from announced jobs: {name: control.Job} (each job's (src ip, dst ip, bytes) pairs).

    A NIC port sends at its line rate, shared among its destination leaves in proportion to the
    bytes its job sends to each; traffic to its own leaf takes no uplink and no share."""
    sent = {}                     # source port -> {dst leaf: bytes}
    origin = {}
    for name, job in sorted(jobs.items()):
        for src_ip, dst_ip, nbytes in job.pairs:
            src, dst = fabric.ip_owner.get(src_ip), fabric.ip_owner.get(dst_ip)
            if src is None or dst is None or nbytes <= 0:
                continue
            by_leaf = sent.setdefault(src, {})
            by_leaf[dst.leaf] = by_leaf.get(dst.leaf, 0) + nbytes
            origin.setdefault(src, name)
    demands = []
    for port, by_leaf in sent.items():
        total = sum(by_leaf.values())
        remote = {leaf: b for leaf, b in by_leaf.items() if leaf != port.leaf}
        for leaf, nbytes in sorted(remote.items()):
            key = DemandKey(port.leaf, port.leaf_port, leaf)
            demands.append(Demand(key, fabric.spec.host_rate_mbps * nbytes / total, f"job:{origin[port]}", port.intf))
    return demands


def merge_demands(fabric, announced, measured_mbps, min_mbps):
    """Announced demands, plus a measured one for every TE entry no job announced that carried
    at least `min_mbps` (traffic the scheduler did not tell TE about)."""
    out = list(announced)
    have = {d.key for d in announced}
    keys = demand_keys(fabric)
    for key, mbps in sorted(measured_mbps.items(), key=lambda kv: _key_order(kv[0])):
        if key not in have and key in keys and mbps >= min_mbps:
            out.append(Demand(key, mbps, "measured", keys[key].intf))
    return out
