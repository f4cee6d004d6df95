"""What the multiplane experiments share (seed 002 section 6.7, Figure 16): who is the main
workload and who is noise under each leaf, which uplinks a degraded leaf keeps, the two main
workloads, and reading the planes' shares and the plane load balancer's timelines back.

Hosts sit under the same leaf index in every plane. Under each leaf the first hosts run the main
workload and the next ones the noise, as the paper splits each leaf's 16 NICs into 8 main and 8
noise; the lab's CPU carries fewer (see `MAIN_PER_LEAF`). A degraded leaf keeps a quarter of its
uplinks in one plane (the paper trims P2/L2 and P3/L3 from 16 to 4 uplinks).
"""

from __future__ import annotations

import math

from fabriclab.errors import LabError
from fabriclab.workflows import faults

DEGRADED = ((3, 2), (4, 3))
"""(plane, leaf index) pairs the paper degrades: its P2/L2 and P3/L3 are the lab's planes 3 and 4
(the lab numbers planes from 1)."""
KEEP = 0.25
"""The share of its uplinks a degraded leaf keeps (16 of 200G to 4 in seed 002 6.7)."""
NOISE_ITERATIONS = 100_000
"""The noise runs until the measured job is done, not to a count."""


def leaf_hosts(fabric):
    """{leaf index: [host names in index order]}."""
    out = {}
    for host in sorted(fabric.hosts.values(), key=lambda h: h.index):
        out.setdefault(host.group, []).append(host.name)
    return out


def roles(fabric, main_per_leaf, noise_per_leaf, leaves=3):
    """(main hosts by leaf, noise hosts by leaf) over the first `leaves` leaves: the first
    `main_per_leaf` hosts of a leaf are main, the next `noise_per_leaf` noise."""
    if fabric.spec.planes < 2:
        raise LabError(f"the multiplane experiments need a multiplane spec; {fabric.spec.name!r} has "
                       f"{fabric.spec.planes} plane")
    by_leaf = leaf_hosts(fabric)
    if len(by_leaf) < leaves:
        raise LabError(f"the multiplane experiments need {leaves} leaves per plane; "
                       f"{fabric.spec.name!r} has {len(by_leaf)}")
    need = main_per_leaf + noise_per_leaf
    short = [k for k in sorted(by_leaf)[:leaves] if len(by_leaf[k]) < need]
    if short:
        raise LabError(f"the multiplane experiments need {need} hosts under each leaf; leaf {short[0]} "
                       f"of {fabric.spec.name!r} has {len(by_leaf[short[0]])}")
    picked = sorted(by_leaf)[:leaves]
    main = {k: by_leaf[k][:main_per_leaf] for k in picked}
    noise = {k: by_leaf[k][main_per_leaf:need] for k in picked}
    return main, noise


def flat(by_leaf):
    return tuple(h for k in sorted(by_leaf) for h in by_leaf[k])


def degraded_uplinks(fabric, degraded=DEGRADED, keep=KEEP):
    """link_down conditions that leave each (plane, leaf index) of `degraded` with `keep` of its
    uplinks (at least one): the first ones by spine and member stay."""
    out = []
    for plane, leaf_index in degraded:
        if plane > fabric.spec.planes:
            raise LabError(f"spec {fabric.spec.name!r} has no plane {plane} to degrade")
        leaf = next((s.name for s in fabric.leaves(plane) if s.index == leaf_index), None)
        if leaf is None:
            raise LabError(f"spec {fabric.spec.name!r} has no leaf {leaf_index} in plane {plane}")
        uplinks = sorted((link for link in fabric.fabric_links if link.a == leaf),
                         key=lambda link: (link.b, link.member))
        kept = max(1, math.ceil(len(uplinks) * keep))
        out += [faults.Fault(len(out), "link_down", link.label, 0.0, {}) for link in uplinks[kept:]]
    return out


def one_to_many(main):
    """The paper's one-to-many: the first main host under leaf 1 scatters to the main hosts
    under the other leaves (repeated bursts: one per iteration). Returns (hosts, root rank)."""
    leaves = sorted(main)
    return (main[leaves[0]][0], *[h for k in leaves[1:] for h in main[k]]), 0


def shares(row):
    """The planes' shares of the data a size row sent, as a list (None where not recorded)."""
    return (row.get("planes") or {}).get("share") or []


def busbw(run, job, index=0):
    return run["jobs"][job]["sizes"][index]["busbw_mbps"]


def counter(run, job, name, index=0):
    return run["jobs"][job]["sizes"][index]["counters"].get(name, 0)


def size_rows(run, job):
    return run["jobs"][job]["sizes"]

