"""Which host ports the latency monitor (measure/pingmesh.py) probes, and which switches each pair
crosses, from the fabric's paths.

By default, in each plane, the first port under each leaf is paired with the first port under
every other leaf of that plane (each pair once): every leaf is an end of some pair and every
switch above the leaves lies on some pair's paths. Past MAX_MESH_LEAVES leaves a plane's leaves
are paired in a ring instead (each with the next), which still crosses every switch.

A pair *must* cross a switch when every one of its shortest paths does (its two leaves, and a
spine when it is the only one between them), and *may* when only some do: where ECMP has several
paths, a probe's flow takes one of them.
"""

from __future__ import annotations

from fabriclab.apps.paths import all_paths, path_nodes
from fabriclab.errors import LabError
from fabriclab.loading import excerpt

MAX_MESH_LEAVES = 8


def default_pairs(fabric):
    """[(source HostPort, destination HostPort)] as the module says."""
    firsts = {}                                   # (plane, leaf) -> its first host port
    for host in sorted(fabric.hosts.values(), key=lambda h: h.index):
        for port in host.ports:
            firsts.setdefault((port.plane, port.leaf), port)
    pairs = []
    for plane in sorted({plane for plane, _leaf in firsts}):
        ports = [firsts[key] for key in sorted(firsts, key=lambda k: (k[0], _leaf_order(k[1]))) if key[0] == plane]
        if len(ports) <= MAX_MESH_LEAVES:
            pairs += [(a, b) for i, a in enumerate(ports) for b in ports[i + 1:]]
        elif len(ports) > 1:
            pairs += [(ports[i], ports[(i + 1) % len(ports)]) for i in range(len(ports))]
    return pairs


def _leaf_order(name):
    digits = "".join(ch if ch.isdigit() else " " for ch in name).split()
    return [int(d) for d in digits], name


def chosen_pairs(fabric, names):
    """[(source, destination)] from [[A, B], ...] of hosts or host ports (a host: its first
    port, or the one in the other's plane); LabError in one line for anything else."""
    if not isinstance(names, (list, tuple)) or not names:
        raise LabError("latency pairs are a list of [A, B] host (or host port) pairs")
    out = []
    for i, item in enumerate(names):
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(n, str) for n in item)):
            raise LabError(f"latency pairs[{i}] must be [A, B] (two hosts or host ports), got {excerpt(item)}")
        a, b = (fabric.host_port(n) for n in item)
        for name, port in zip(item, (a, b)):
            if port is None:
                raise LabError(f"latency pairs[{i}]: no host or host port {excerpt(name)}")
        if b.plane != a.plane and item[1] in fabric.hosts:
            b = next((p for p in fabric.hosts[item[1]].ports if p.plane == a.plane), b)
        if a.plane != b.plane:
            raise LabError(f"latency pairs[{i}]: {a.intf} and {b.intf} are in different planes")
        if a.host == b.host:
            raise LabError(f"latency pairs[{i}]: both ends are on {a.host}")
        out.append((a, b))
    return out


def crossings(fabric, src, dst, down=frozenset()):
    """(must, may): the switches every shortest path from `src` to `dst` (host ports) crosses, and
    those only some do."""
    paths = [set(path_nodes(path, src.leaf)) for path in all_paths(fabric, src.leaf, dst.leaf, down)]
    if not paths:
        return set(), set()
    must = set.intersection(*paths)
    return must, set.union(*paths) - must


def covered(fabric, pairs):
    """The switches that some pair's paths cross (must or may)."""
    out = set()
    for a, b in pairs:
        must, may = crossings(fabric, a, b)
        out |= must | may
    return out


def dscps(spec):
    """{class: the DSCP its probes carry}: the spec's first lossless DSCP (the queue model's
    default where it has none) and the first DSCP of neither lossless nor control."""
    from fabriclab.queues.config import QueueSpec

    queues = spec.queues or QueueSpec()
    taken = set(queues.lossless_dscp) | set(queues.control_dscp)
    return {"lossless": queues.lossless_dscp[0], "lossy": next(d for d in range(64) if d not in taken)}


def probes(fabric, names=()):
    """One probe per pair (chosen by `names`, else the default pairs) and class: {"src", "dst"
    (interfaces), "class", "must", "may", "src_host", "src_ip", "dst_ip", "tos"}."""
    pairs = chosen_pairs(fabric, names) if names else default_pairs(fabric)
    dscp = dscps(fabric.spec)
    out = []
    for a, b in pairs:
        must, may = crossings(fabric, a, b)
        for cls in ("lossless", "lossy"):
            out.append({"src": a.intf, "dst": b.intf, "class": cls, "must": must, "may": may, "src_host": a.host,
                        "src_ip": a.ip, "dst_ip": b.ip, "tos": dscp[cls] << 2})
    return out
