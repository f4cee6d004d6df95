"""Where each flow goes under a routing scheme: a route is a list of (link, fraction).

- ecmp:  every switch hashes the 5-tuple (addresses, protocol, UDP ports) and picks one of its
         shortest-path next hops, as an Open vSwitch select group or a switch ASIC does. The UDP
         source port comes from the QP pair, so QP scaling adds entropy unless ports are shared.
- eecmp: Enhanced ECMP (seed 000, section 4.2.2): the hash also covers the BTH destination QP,
         so QPs of one NIC pair spread even when they share a source port.
- pinning: path pinning (seed 000, section 4.1.2; apps/pinning.py): at every switch with a
         choice, a flow takes the failure-free next hop of index (its destination port's slice, its
         index among its leaf's host ports) modulo their number, whatever its 5-tuple; where that
         member is down, ECMP's hashed choice among the live ones.
- te:    centralized traffic engineering (seed 000, section 4.3): flows sorted by demand, largest
         first, each pinned to the shortest path with the most residual capacity (CSPF); the
         demand is what the flow would get in a non-blocking fabric (its NIC share). A flow that
         no path can carry in full still takes the widest one, and is counted as unsatisfied.
- flowlet: flowlet switching as the lab's stage does it (docs/routing.md): a flowlet starts on
         the next hop that carries the least, scanning from the hash's choice so ties spread.
         See _flowlet for what a flowlet is in a fluid model.
- spray: per-packet spraying, equal shares over every next hop at every switch, blind to
         failures further on (seed 002, section 2.2: "load-oblivious spraying").
- ideal: per-packet adaptive routing: at every switch the share of each next hop is
         proportional to the capacity it still has to the destination (its max-flow there), so a
         single flow gets the full leaf-pair max-flow. On a failure-free symmetric fabric it
         splits equally and is the bound; after failures it is the weighted-routing reference,
         not a global optimum, and demand-aware TE can beat it.
- optimal: the global optimum (optimal.py): each leaf pair's demand split over its shortest
         paths to minimise the largest link utilisation, by a linear program; the bound TE is
         measured against.

The hash is CRC-32 of the header fields mixed with a per-switch seed (a model of a switch's hash,
not Open vSwitch's exact function): the same flow takes the same path every step, different
switches make independent choices, and the statistics are what real hashing gives.
"""

from __future__ import annotations

import weakref

import numpy as np

from fabriclab.apps import APPS, RoutingError, app_info
from fabriclab.apps.hashing import flow_hash as stage_hash
from fabriclab.apps.hashing import mix, ovs_group_hash, ovs_hash_bucket, switch_basis
from fabriclab.errors import LabError
from fabriclab.model.routes import Routes
from fabriclab.model.splitting import Placement, Splitter, demands, host_ends, leaf_of, per_flow
from fabriclab.topologies.fabric import switch_dpid
from fabriclab.traffic.roce import IPPROTO_UDP, ROCEV2_UDP_PORT

# The model's own placements; each routing app names the one that predicts it (apps APPS, `model`),
# and is a scheme here too under its own name.
PLACEMENTS = ("ecmp", "eecmp", "te", "flowlet", "spray", "ideal", "optimal", "pinning")
APP_PLACEMENT = {name: info.model for name, info in APPS.items() if info.model in PLACEMENTS}
SCHEMES = (*APP_PLACEMENT, *(p for p in PLACEMENTS if p not in APP_PLACEMENT))
_MASK = 0xFFFFFFFF
_INF = float("inf")


def place(graph, routes, flows, scheme, hash_seed=0, shared_basis=False):
    """Route every flow of a step under `scheme`, over the Routes (failures) given; the hashing
    schemes hash from each switch's basis in a run seeded `hash_seed` (`shared_basis`: one basis
    for every switch, the misconfiguration that polarizes: apps/hashing.py)."""
    asked, scheme = scheme, APP_PLACEMENT.get(scheme, scheme)
    if scheme not in PLACEMENTS and isinstance(scheme, str):
        scheme = _plugin_placement(scheme)
    if scheme in ("ecmp", "eecmp"):
        placed = _hashed(graph, routes, flows, scheme == "eecmp", hash_seed, shared_basis)
    elif scheme in ("spray", "ideal"):
        placed = _split(graph, routes, flows, weighted=scheme == "ideal")
    elif scheme == "te":
        placed = _cspf(graph, routes, flows)
    elif scheme == "flowlet":
        placed = _flowlet(graph, routes, flows, hash_seed, shared_basis)
    elif scheme == "pinning":
        placed = _pinned(graph, routes, flows, hash_seed, shared_basis)
    elif scheme == "optimal":
        from fabriclab.model.optimal import place_optimal     # its LP solver loads only when asked
        placed = place_optimal(graph, routes, flows)
    else:
        raise LabError(f"routing must be one of {', '.join(SCHEMES)}, got {asked!r}")
    placed.scheme = asked
    placed.unroutable = sum(1 for r in placed.routes if r is None)
    return placed


def _plugin_placement(name):
    """The placement an installed package's routing app names (fabriclab/plugins.py), or `name`
    itself when there is no such app (refused below)."""
    try:
        model = app_info(name).model
    except RoutingError:
        return name
    if model not in PLACEMENTS:
        raise LabError(f"routing app {name} names no placement of the flow model (its AppInfo's model)")
    return model


# -- hashing ----------------------------------------------------------------------------------------
# The emulation's hashes (apps/hashing.py), switch by switch from each switch's basis: ECMP as an
# Open vSwitch `hash` group scores its buckets, E-ECMP and flowlet's first choice as the stage.

def _mix(h):
    """A 32-bit avalanche (murmur3's finalizer): orders a step's flowlets."""
    return mix(0, h)


_ROLES = ("leaf", "spine", "super_spine")


def switch_dpids(graph):
    """Each model switch's dpid, as the emulation gives the switch of that name (its tier, plane and
    global index: topologies/fabric.py switch_dpid)."""
    return [switch_dpid(_ROLES[tier], plane, int(name.rsplit("s" if tier else "l", 1)[1]))
            for name, tier, plane in zip(graph.sw_name, graph.sw_tier, graph.sw_plane)]


def switch_seeds(graph, hash_seed=0, shared=False):
    """Each switch's hash basis in a run seeded `hash_seed` (shared: one for all, which polarizes)."""
    return [switch_basis(dpid, hash_seed, shared) for dpid in switch_dpids(graph)]


def _fields(graph, flow):
    return (graph.port_ip[flow.src - graph.n_switches], graph.port_ip[flow.dst - graph.n_switches],
            IPPROTO_UDP, flow.sport, ROCEV2_UDP_PORT)


def flow_hash(graph, flow, with_qp=False, basis=0):
    """The stage's hash of a flow's packets at a switch whose basis is `basis`: the 5-tuple, plus
    the destination QP for E-ECMP."""
    return stage_hash(*_fields(graph, flow), qp=flow.dst_qpn if with_qp else None, seed=basis)


def _crossing(graph, routes, flows, order, out):
    """The flows, in `order`, between two connected leaves: (index, src leaf, dst leaf, host
    uplink, host downlink). A flow within one leaf gets its route in `out` here (it needs no
    fabric link); an unreachable one is skipped and stays None there."""
    for i in order:
        flow = flows[i]
        a, b = leaf_of(graph, flow.src), leaf_of(graph, flow.dst)
        up, down = host_ends(graph, flow)
        if a == b:
            out[i] = [up, down]
        elif routes.reachable(a, b):
            yield i, a, b, up, down


def _hashed(graph, routes, flows, with_qp, hash_seed, shared=False):
    """ECMP: each switch's select group picks the bucket with the highest score of the flow's
    5-tuple hashed from the switch's basis (with one basis everywhere, the same bucket index at
    every tier); E-ECMP: the stage's member, the hash (QP included) modulo the members."""
    seeds = switch_seeds(graph, hash_seed, shared)
    dst_of = graph.link_dst

    def middle(flow, a, b):
        if not routes.reachable(a, b):
            return None
        fields = _fields(graph, flow)
        hops, x = [], a
        while x != b:
            opts = routes.options_array(x, b)        # an array: a tuple of 128 ints costs 4.6 KB
            if with_qp:
                k = stage_hash(*fields, qp=flow.dst_qpn, seed=seeds[x]) % len(opts)
            else:
                k = ovs_hash_bucket(ovs_group_hash(*fields, basis=seeds[x]), [(i, 1) for i in range(len(opts))])
            e = int(opts[k])
            hops.append((e, 1.0))
            x = dst_of[e]
        return hops

    return per_flow(graph, flows, middle)


# -- path pinning ----------------------------------------------------------------------------------

_INTACT = weakref.WeakKeyDictionary()      # graph -> its Routes with nothing down: the pins' members


def port_slices(graph):
    """Each host port's slice (indexed by port - n_switches): its index among its leaf's host
    ports in id order, which is fabric.py's slot order in rack and rail cabling alike."""
    leaf = np.asarray(graph.port_leaf, dtype=np.int64)
    order = np.argsort(leaf, kind="stable")
    first = np.searchsorted(leaf[order], leaf[order])          # where each port's leaf starts
    slices = np.empty(len(leaf), dtype=np.int64)
    slices[order] = np.arange(len(leaf)) - first
    return slices


def _pinned(graph, routes, flows, hash_seed, shared=False):
    """Path pinning (apps/pinning.py): at each switch whose failure-free next hops toward the
    destination leaf number more than one, the one of index slice % their number; where that one
    is not a live next hop (or there is no choice), ECMP's select group over the live ones."""
    seeds = switch_seeds(graph, hash_seed, shared)
    intact = routes if not routes.down else _INTACT.setdefault(graph, Routes(graph))
    slices = port_slices(graph)
    dst_of = graph.link_dst

    def middle(flow, a, b):
        if not routes.reachable(a, b):
            return None
        k = int(slices[flow.dst - graph.n_switches])
        hops, x = [], a
        while x != b:
            live = routes.options_array(x, b)
            members = intact.options_array(x, b)
            e = int(members[k % len(members)]) if len(members) > 1 else -1
            if e < 0 or e not in live:
                bucket = ovs_hash_bucket(ovs_group_hash(*_fields(graph, flow), basis=seeds[x]),
                                         [(i, 1) for i in range(len(live))])
                e = int(live[bucket])
            hops.append((e, 1.0))
            x = dst_of[e]
        return hops

    return per_flow(graph, flows, middle)


# -- flowlets --------------------------------------------------------------------------------------

def _flowlet(graph, routes, flows, hash_seed, shared=False):
    """Least-loaded choice per flowlet, the lab's flowlet stage in a fluid model.

    The stage sends a new flow, or one idle longer than the flowlet gap (10 ms by default), to
    the member that sent the fewest bytes lately, scanning from the hash's member. In the model
    a flow sends a collective step's bytes at a steady rate (an RDMA NIC has no pauses within a
    message), so each flow of a step is one flowlet; the pause between steps ends it, and the
    next step, with the same flows on the same loads, chooses the same way, so one placement per
    step holds at any gap. A step's flowlets start together and are placed in hash order (their
    first packets arrive in no particular order); the load a member has is the demand (NIC
    share, as TE's) of the flowlets already on it. Each switch chooses for itself, blind to the
    links after it: two flowlets that spread over a leaf's uplinks can still meet on one
    spine-to-leaf link, which TE and the optimum avoid."""
    seeds = switch_seeds(graph, hash_seed, shared)
    dst_of = graph.link_dst
    need = demands(graph, flows)
    fields = [_fields(graph, f) for f in flows]
    load = np.zeros(graph.n_links)
    out = [None] * len(flows)
    order = sorted(range(len(flows)), key=lambda i: (_mix(stage_hash(*fields[i], seed=hash_seed & _MASK)), i))
    for i, a, b, up, down in _crossing(graph, routes, flows, order, out):
        hops, x = [], a
        while x != b:
            opts = routes.options_array(x, b)
            start = stage_hash(*fields[i], seed=seeds[x]) % len(opts)
            here = load[opts]
            least = np.flatnonzero(here == here.min())
            # the first of the least loaded, scanning from the hash's member onwards (cyclically)
            e = int(opts[least[np.searchsorted(least, start) % len(least)]])
            load[e] += need[i]
            hops.append((e, 1.0))
            x = dst_of[e]
        out[i] = [up, *hops, down]
    return Placement("", out)


# -- per-packet splitting -------------------------------------------------------------------------

def _split(graph, routes, flows, weighted):
    if not routes.down:
        return _uniform_split(graph, flows)
    splitter = Splitter(graph, routes, weighted)
    return per_flow(graph, flows, lambda _flow, a, b: splitter.pair(a, b))


def _uniform_split(graph, flows):
    """spray and ideal with no link down: both split every flow equally over each tier's links
    (the tiers of a ClosGraph have one rate each, so every next hop can carry as much onward).
    So all links of a flow's tier group (its leaf's uplinks; its pod's spine-to-superspine links
    going up; those into the destination pod coming down; the links into its destination leaf)
    carry equal loads and fill together: one stand-in link per group with the members' summed
    capacity gives the same rates as the per-link routes, 2 + 2 x spines links long, did."""
    a = graph.arrays()
    tier = np.asarray(graph.sw_tier)
    pod_of = graph.sw_pod
    first = 2 * graph.n_ports
    src, dst = a.link_src[first:], a.link_dst[first:]
    fabric = np.arange(first, graph.n_links)
    groups, index = [], {}

    def group(key, members):
        found = index.get(key)
        if found is None:
            found = index[key] = graph.n_links + len(groups)
            groups.append(members())
        return found

    def up(leaf):
        return group(("up", leaf), lambda: a.out_links[a.out_start[leaf]:a.out_start[leaf + 1]])

    def down(leaf):                  # the other direction of each of the leaf's cables up
        return group(("down", leaf), lambda: np.array(sorted(e ^ 1 for links in graph.adj[leaf].values()
                                                             for e in links), dtype=np.int64))

    def core(way, plane, pod):
        def members():
            spines = (tier == 1) & (np.asarray(graph.sw_plane) == plane) & (np.asarray(pod_of) == pod)
            ends = src if way == "up" else dst
            others = dst if way == "up" else src
            return fabric[spines[ends] & (tier[others] == 2)]
        return group((way, plane, pod), members)

    def middle(_flow, x, y):
        route = [(up(x), 1.0)]
        if pod_of[x] != pod_of[y]:
            plane = graph.sw_plane[x]
            route += [(core("up", plane, pod_of[x]), 1.0), (core("down", plane, pod_of[y]), 1.0)]
        return route + [(down(y), 1.0)]

    return Placement("", per_flow(graph, flows, middle).routes, groups=groups)


# -- traffic engineering (CSPF) -------------------------------------------------------------------

def _cspf(graph, routes, flows):
    residual = list(graph.link_cap)
    # numpy copy for the two-hop case; both are updated together (the list keeps the general
    # recursion fast, the array lets one flow's 2 x spines candidates be scored at once)
    res = np.append(graph.arrays().link_cap, -_INF)          # last entry: padding, never wins
    dst_of = graph.link_dst
    dst_np = graph.arrays().link_dst
    need = demands(graph, flows)
    into = {}
    # Largest first; equal demands keep the step's order, so placement is deterministic.
    order = sorted(range(len(flows)), key=lambda i: -need[i])
    out = [None] * len(flows)
    unsatisfied = 0
    for i, a, b, up, down in _crossing(graph, routes, flows, order, out):
        if routes.dist(b)[a] == 2:
            width, hops = _widest_two_hops(routes, res, dst_np, into, a, b)
        else:
            width, hops = _widest(routes, residual, dst_of, a, b)
        if width < need[i] - 1e-9:
            unsatisfied += 1
        for e in hops:
            residual[e] -= need[i]
            res[e] -= need[i]
        out[i] = [up, *((e, 1.0) for e in hops), down]
    placed = Placement("", out)
    placed.unsatisfied = unsatisfied
    return placed


def _first_widest(widths):
    """Index of the first entry within 1e-9 of the widest (a scan keeping the first of ties)."""
    return int(np.argmax(widths >= widths.max() - 1e-9))


def _widest_two_hops(routes, res, dst_np, into, a, b):
    """Widest leaf -> switch -> leaf path on residual capacity `res`, scored all at once: each
    first hop's width is the lesser of its own residual and the best link from its far end
    into b. into[b] holds, per switch, its live links into b (padded with len(res) - 1)."""
    table = into.get(b)
    if table is None:
        table = into[b] = _links_into(routes, b, len(res) - 1)
    first = routes.options_array(a, b)
    onward = table[dst_np[first]]                     # (candidates, parallel members)
    widths = np.minimum(res[first], res[onward].max(axis=1))
    k = _first_widest(widths)
    last = onward[k][onward[k] < len(res) - 1]
    return float(widths[k]), (int(first[k]), int(last[_first_widest(res[last])]))


def _links_into(routes, b, pad):
    """{switch: its live links into leaf b}, as a switches x members array padded with `pad`."""
    graph = routes.graph
    lists = {y: [e for e in links if routes.live[e]] for y, links in graph.adj[b].items()}
    width = max((len(v) for v in lists.values()), default=1) or 1
    table = np.full((graph.n_switches, width), pad, dtype=np.int64)
    for y, links in lists.items():
        back = [e ^ 1 for e in links]          # the cable's other direction: y -> b
        table[y, :len(back)] = back
    return table


def _widest(routes, residual, dst_of, a, b):
    """(width, links) of the widest shortest path from a to b on residual capacity."""
    memo = {}

    def widest(x):
        if x == b:
            return _INF, None
        got = memo.get(x)
        if got is None:
            got = (-_INF, None)
            for e in routes.options(x, b):
                w = min(residual[e], widest(dst_of[e])[0])
                if w > got[0] + 1e-9:
                    got = (w, e)
            memo[x] = got
        return got

    width = widest(a)[0]
    hops, x = [], a
    while x != b:
        e = memo[x][1]
        hops.append(e)
        x = dst_of[e]
    return width, hops


def fabric_links(route):
    """The switch-to-switch links of a route (drops the host links at either end). Ids from
    graph.n_links up are a placement's stand-in links (Placement.groups)."""
    return [e for e, _ in route[1:-1]] if route else []

